"""Renderers: turn a result into Rich output. They format; they never compute."""
