"""compare-clipping: train the same start under each clipping strategy and say which one to use."""

from nanscope.run.clipping.compare import compare_clipping
from nanscope.run.clipping.result import ClippingReport, StrategyRun
from nanscope.run.clipping.strategies import DEFAULT_STRATEGIES, Strategy, StrategyError, parse_strategies

__all__ = ["DEFAULT_STRATEGIES", "ClippingReport", "Strategy", "StrategyError", "StrategyRun", "compare_clipping",
           "parse_strategies"]
