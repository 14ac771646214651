"""Forensics: replay the one step that went non-finite and name the op, layer and line that produced it."""

from nanscope.forensics.replay import Localization, describe_event, localize_step, replay_step
from nanscope.forensics.repro import load_repro, save_repro

__all__ = ["Localization", "describe_event", "load_repro", "localize_step", "replay_step", "save_repro"]
