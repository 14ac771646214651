"""The private Keras and TensorFlow hooks of nanscope.internals, one canary per hook.

A failure here names the hook and the installed versions: a Keras or TensorFlow
upgrade changed something nanscope relies on, and this is the one place to adapt.
"""

import pytest

from nanscope.internals import override, overridden, restore


class Owner:
    def greet(self):
        return "class"


def test_override_and_restore_put_back_an_instance_attribute_or_its_absence():
    owner = Owner()
    saved = override(owner, "greet", lambda: "hooked")
    assert owner.greet() == "hooked"
    restore(saved)
    assert owner.greet() == "class" and "greet" not in owner.__dict__
    owner.greet = lambda: "instance"
    restore(override(owner, "greet", lambda: "hooked"))
    assert owner.greet() == "instance"


def test_overridden_restores_even_when_the_block_raises():
    owner = Owner()
    with pytest.raises(RuntimeError), overridden([(owner, "greet", lambda greet: lambda: greet().upper())]):
        assert owner.greet() == "CLASS"
        raise RuntimeError
    assert owner.greet() == "class" and "greet" not in owner.__dict__
