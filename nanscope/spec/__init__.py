"""What the user asks for, validated once at the edge: the YAML run spec (`sections`, read by `load`) and each
command's options (`options`), which the CLI, the command and the library share."""
