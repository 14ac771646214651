"""One module per CLI command, each holding that command's orchestration.

`nanscope.cli` parses the options and calls `run(...)` of the command's module; the
module checks the output paths, calls the library and ends with `deliver`: render
the human report, write the JSON, return the exit code. Nothing here is imported
by `nanscope --help`, so the command modules may import TensorFlow-backed code.
"""
