"""The op-domain table (`rules/domains.py`): for every op it knows, an operand just inside and just outside the
op's domain and its gradient's, and the words the op rules cite. Each boundary is written out here, not read
from the table, so a flipped comparison or a moved bound fails a row."""

import math

import pytest

from nanscope.rules.domains import OVERFLOW, domain_of, outside

BELOW_MINUS_1 = math.nextafter(-1.0, -math.inf)
ABOVE_MINUS_1 = math.nextafter(-1.0, math.inf)
BELOW_1 = math.nextafter(1.0, -math.inf)
ABOVE_1 = math.nextafter(1.0, math.inf)


def measured(low=0.5, high=0.5, zeros=0.0, negatives=0.0):
    return {"min": low, "max": high, "zero_fraction": zeros, "negative_fraction": negatives}


# (op, operand, backward, outside): the rows where `outside` must speak and where it must not.
ROWS = [
    # zero or negative operands: Log, Rsqrt, Xlogy, Pow need neither; Sqrt's value takes 0, its gradient does not.
    *[(op, measured(zeros=0.1), False, True) for op in ("Log", "Rsqrt", "Xlogy", "Pow")],
    *[(op, measured(negatives=0.1), False, True) for op in ("Log", "Rsqrt", "Xlogy", "Pow", "Sqrt")],
    *[(op, measured(), backward, False) for op in ("Log", "Rsqrt", "Xlogy", "Pow", "Sqrt") for backward in (0, 1)],
    ("Sqrt", measured(zeros=0.1), False, False),
    ("Sqrt", measured(zeros=0.1), True, True),
    # a zero denominator, under each of its names
    *[(op, measured(zeros=0.1), False, True) for op in ("RealDiv", "Div", "Xdivy", "Reciprocal", "Inv")],
    *[(op, measured(negatives=0.1), False, False) for op in ("RealDiv", "Div", "Xdivy", "Reciprocal", "Inv")],
    # log1p's pole at -1
    *[(op, measured(low=-1.0), False, True) for op in ("Log1p", "Xlog1py")],
    *[(op, measured(low=ABOVE_MINUS_1), False, False) for op in ("Log1p", "Xlog1py")],
    # acos / asin: the value takes [-1, 1], the gradient only (-1, 1)
    *[(op, measured(low=BELOW_MINUS_1), False, True) for op in ("Acos", "Asin")],
    *[(op, measured(high=ABOVE_1), False, True) for op in ("Acos", "Asin")],
    *[(op, measured(low=-1.0, high=1.0), False, False) for op in ("Acos", "Asin")],
    *[(op, measured(low=-1.0), True, True) for op in ("Acos", "Asin")],
    *[(op, measured(high=1.0), True, True) for op in ("Acos", "Asin")],
    *[(op, measured(low=ABOVE_MINUS_1, high=BELOW_1), True, False) for op in ("Acos", "Asin")],
    # atanh: (-1, 1) for both
    ("Atanh", measured(low=-1.0), False, True), ("Atanh", measured(high=1.0), False, True),
    ("Atanh", measured(low=ABOVE_MINUS_1, high=BELOW_1), False, False),
    # acosh: the value takes [1, inf), the gradient (1, inf)
    ("Acosh", measured(low=BELOW_1, high=2.0), False, True), ("Acosh", measured(low=1.0, high=2.0), False, False),
    ("Acosh", measured(low=1.0, high=2.0), True, True), ("Acosh", measured(low=ABOVE_1, high=2.0), True, False),
    # lgamma / digamma: a pole needs a value at or below 0 and a zero or negative share
    *[(op, measured(low=0.0, zeros=0.1), False, True) for op in ("Lgamma", "Digamma")],
    *[(op, measured(low=-2.0, negatives=0.1), False, True) for op in ("Lgamma", "Digamma")],
    *[(op, measured(low=math.nextafter(0.0, 1.0), zeros=0.1), False, False) for op in ("Lgamma", "Digamma")],
    *[(op, measured(low=0.0), False, False) for op in ("Lgamma", "Digamma")],
    # ops whose operand the table cannot judge: the result overflowed
    *[(op, measured(low=-5.0, high=5.0, zeros=0.5, negatives=0.5), False, False)
      for op in ("Exp", "Softmax", "Prod", "MatMul")],
]


@pytest.mark.parametrize("op, inputs, backward, expected", ROWS,
                         ids=[f"{r[0]}-{'grad' if r[2] else 'value'}-{i}" for i, r in enumerate(ROWS)])
def test_an_operand_is_outside_exactly_where_the_op_or_its_gradient_is_not_finite(op, inputs, backward, expected):
    assert (outside(op, inputs, bool(backward)) is not None) is expected


def test_a_missing_measurement_is_never_outside():
    assert outside("Log1p", {}, False) is None and outside("Acos", {}, True) is None
    assert outside("Log", {"min": 0.0, "max": 1.0}, False) is None  # no zero or negative share measured


def test_outside_names_the_op_or_its_gradient_and_the_domain_it_left():
    assert outside("Log", measured(zeros=0.1), False) == "outside Log's domain x > 0"
    assert outside("Sqrt", measured(zeros=0.1), True) == "outside its gradient's domain x > 0 (0.5/sqrt(x))"
    assert outside("Div", measured(zeros=0.1), False) == "outside Div's domain denominator != 0"
    assert outside("Inv", measured(zeros=0.1), True) == "outside its gradient's domain x != 0"


def test_an_op_without_an_entry_has_the_overflow_domain_and_the_aliases_share_their_ops():
    assert domain_of("MatMul") is OVERFLOW and domain_of("Conv2D") is OVERFLOW
    for alias, op in (("Div", "RealDiv"), ("Inv", "Reciprocal"), ("Xdivy", "RealDiv"), ("Expm1", "Exp")):
        assert domain_of(alias) == domain_of(op)
    assert domain_of("Exp").forward == "x < log(dtype max): 88.7 in float32, 11.1 in float16"
