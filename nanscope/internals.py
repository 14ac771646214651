"""Every private Keras and TensorFlow hook nanscope relies on, in one place.

nanscope reads and wraps a few things that are not public API: Keras' CompileLoss
(`_compile_loss`, its `_flat_losses`, `_user_loss_weights` and build structures),
`Layer._flatten_layers` and `_get_own_losses`, the optimizer's `_clip_gradients`,
TensorFlow's `op_callbacks` and the `_gradient_function` frame of its gradient
tape. Each is reached only through a function here, and each has a canary test
(tests/test_internals.py) that names the hook and the installed versions when an
upgrade changes it, so a Keras or TensorFlow release breaks loudly in one place.

Hooks are attached by overriding an attribute on the instance (`overridden`),
which bypasses Keras' attribute tracking, and always restored as they were found.
"""

import contextlib

_MISSING = object()


def override(owner, name, value):
    """Set `name` on the instance `owner` (past Keras' attribute tracking); return what `restore` needs."""
    previous = owner.__dict__.get(name, _MISSING)
    object.__setattr__(owner, name, value)
    return owner, name, previous


def restore(saved):
    """Undo one `override`: put the instance attribute back, or remove it when there was none."""
    owner, name, previous = saved
    if previous is _MISSING:
        object.__delattr__(owner, name)
    else:
        object.__setattr__(owner, name, previous)


@contextlib.contextmanager
def overridden(hooks):
    """Wrap attributes for the block and always restore them, even when the block raises.

    Args:
        hooks: iterable of (owner, name, wrap). `owner.name` becomes `wrap(owner.name)`.
    """
    saved = []
    try:
        for owner, name, wrap in hooks:
            saved.append(override(owner, name, wrap(getattr(owner, name))))
        yield
    finally:
        for one in reversed(saved):
            restore(one)
