"""The target arrays of a data section: which output each belongs to, and its loss.

A single-output model has one target array. A multi-output one has one per output,
given as a mapping from output name (`data.y` for npz/npy, `data.target` for csv and
TFRecord, the dict a factory returns) or as a list in output order. A `TargetPart` is
one of them: the output it belongs to, where it is read from and the spec field that
names it. Readers turn parts into distinct array names; the scan pairs each with the
loss of its output from `train.loss`.

Example:
    parts = spec_parts({"price": "y_price", "kind": "y_kind"}, "data.y")
    [p.field for p in parts]  # ["data.y.price", "data.y.kind"]
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nanscope.errors import SpecError

if TYPE_CHECKING:
    from nanscope.spec.sections import LossSpec


@dataclass(frozen=True)
class TargetPart:
    """One target array named by a data section.

    Args:
        output: str, int or None. The output's name (mapping form), its position (list
            form), or None for the one target array of a single-output model.
        source: the npz key, npy file, csv column(s), TFRecord feature, or the key/index
            into a factory's targets the array is read from.
        field: str. The spec field that names it ("data.y.price", "data.target"), for messages.
    """

    output: str | int | None
    source: Any
    field: str


def spec_parts(value: Any, field_name: str, list_is_one_target: bool = False) -> list[TargetPart]:
    """The TargetParts of a spec value: `data.y`, or `data.target` with `list_is_one_target`.

    Args:
        value: str, list or dict. The field's value.
        field_name: str. "data.y" or "data.target".
        list_is_one_target: bool, default False. True for csv/TFRecord `target`, where a
            list names the columns of one target rather than one target per output.
    """
    if isinstance(value, dict):
        return [TargetPart(name, source, f"{field_name}.{name}") for name, source in value.items()]
    if isinstance(value, (list, tuple)) and not list_is_one_target:
        return [TargetPart(i, source, f"{field_name}[{i}]") for i, source in enumerate(value)]
    return [TargetPart(None, value, field_name)]


def structure_parts(keys: list[str] | int | None, field_name: str) -> list[TargetPart]:
    """TargetParts of a factory's targets: `keys` lists dict keys, counts tuple members (an int), or is None."""
    if keys is None:
        return [TargetPart(None, None, field_name)]
    if isinstance(keys, int):
        return [TargetPart(i, i, field_name) for i in range(keys)]
    return [TargetPart(k, k, field_name) for k in keys]


def array_names(parts: list[TargetPart], taken: Iterable[str], unnamed: Callable[[TargetPart], object]
                ) -> dict[str, TargetPart]:
    """{array name: part}: the output's name when it has one, else `unnamed(part)`; never a name in `taken`.

    Args:
        parts: list of TargetPart.
        taken: iterable of str. Names already used (the input arrays).
        unnamed: callable(TargetPart) -> str. The name of a part without an output name.
    """
    used, named = set(taken), dict[str, TargetPart]()
    for part in parts:
        name = part.output if isinstance(part.output, str) else str(unnamed(part))
        candidate, n = name, 1
        while candidate in used:
            candidate = f"y.{name}" if n == 1 else f"y.{name}.{n}"
            n += 1
        used.add(candidate)
        named[candidate] = part
    return named


def output_losses(loss: "LossSpec | dict[str, LossSpec] | list[LossSpec] | None", outputs: list[str | int | None],
                  origin: str) -> list[str | None]:
    """The loss name for each output in `outputs`, from a spec's `train.loss`.

    One loss applies to every output. A mapping is paired by output name and a list by
    position. Where the targets and the losses are given in different forms (a mapping
    of targets and a list of losses, or the reverse), their order cannot be matched
    without the model: they are paired only when every loss has the same name.

    Args:
        loss: LossSpec, dict of LossSpec, list of LossSpec, or None.
        outputs: list. Per target array, its output: a name, a position or None.
        origin: str. The spec file, for messages.

    Returns:
        list of str or None, one per entry of `outputs`.

    Raises:
        SpecError: when the losses cannot belong to these targets (other names, another count).
    """
    if loss is None:
        return [None] * len(outputs)
    if not isinstance(loss, (dict, list)):
        return [loss.name] * len(outputs)
    names = [o for o in outputs if isinstance(o, str)]
    if isinstance(loss, dict) and names and len(names) == len(outputs):
        if set(loss) != set(names):
            raise SpecError(f"{origin}: train.loss: the losses are named {list(loss)} but the targets are "
                            f"named {names}; expected one loss per output")
        return [loss[o].name for o in names]  # names is outputs here: every output is named
    if len(loss) != len(outputs):
        raise SpecError(f"{origin}: train.loss: {len(loss)} losses for {len(outputs)} target array(s)")
    if isinstance(loss, list) and not names:
        return [entry.name for entry in loss]
    entries = list(loss.values()) if isinstance(loss, dict) else loss
    common = {entry.name for entry in entries}
    return [common.pop() if len(common) == 1 else None] * len(outputs)
