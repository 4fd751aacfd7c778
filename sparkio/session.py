"""A local SparkSession set up the way ring's tests, demo and examples need.

Python workers must find ``sparkio`` and ``ring`` (installed, or through
PYTHONPATH), run the same interpreter as the driver, and talk over loopback
only; the UI is off and shuffles are small because these sessions hold a few
thousand records, not a cluster's worth.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping

_REPO_ROOT = str(Path(__file__).resolve().parent.parent)


def local_session(app_name: str = "ring", cores: int = 2, shuffle_partitions: int = 4,
                  conf: Mapping[str, Any] | None = None):
    """A ``local[cores]`` SparkSession with the ``ring`` source registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Workers inherit the driver's environment: make the source tree
    # importable there even when ring is not pip-installed.
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if _REPO_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [_REPO_ROOT, *paths] if p)

    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{cores}]").appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, str(v))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from sparkio import register

    register(spark)
    return spark
