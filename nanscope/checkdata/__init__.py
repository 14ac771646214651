"""check-data: a streaming health scan of training data (NaN/Inf, scale, labels) before any training."""

from nanscope.checkdata.result import SCHEMA, ColumnReport, DataScan
from nanscope.checkdata.scan import scan_data

__all__ = ["SCHEMA", "ColumnReport", "DataScan", "scan_data"]
