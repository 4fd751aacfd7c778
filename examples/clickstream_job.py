"""Sessions and top pages per minute over a ring clickstream topic, with Spark.

Copy this file to start a job of your own. It runs anywhere PySpark runs:

    # against a running broker, on a local Spark:
    python examples/clickstream_job.py --brokers http://127.0.0.1:9250 --local
    # fill the topic with generated events first:
    python examples/clickstream_job.py --brokers http://127.0.0.1:9250 --local --generate 20000
    # on a cluster (ring and sparkio importable by the executors):
    spark-submit examples/clickstream_job.py --brokers http://ring-0:9250,http://ring-1:9250

It reads the whole topic as a DataFrame (``spark.read.format("ring")``),
parses the JSON events, aggregates per minute, prints the table, and writes
one JSON record per minute to the output topic. The work is in
``sparkio.pipeline``; this file is the command line around it.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", required=True, help="comma-separated broker URLs")
    p.add_argument("--topic", default="clicks", help="input topic (default clicks)")
    p.add_argument("--out-topic", default="clicks-per-minute",
                   help="where the per-minute records go; '' to skip writing")
    p.add_argument("--top", type=int, default=3, help="pages listed per minute")
    p.add_argument("--min-partitions", type=int, default=None, help="at least this many Spark tasks")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="first produce N generated clickstream events to --topic")
    p.add_argument("--local", action="store_true", help="run on a local[2] Spark in this process")
    args = p.parse_args(argv)

    from sparkio.pipeline import clickstream_job, produce_clickstream

    if args.generate:
        produce_clickstream(args.brokers, args.topic, args.generate)
        print(f"produced {args.generate} events to {args.topic!r}")

    if args.local:
        from sparkio.session import local_session

        spark = local_session("clickstream-job")
    else:
        from pyspark.sql import SparkSession

        import sparkio

        spark = SparkSession.builder.appName("clickstream-job").getOrCreate()
        sparkio.register(spark)
    try:
        clickstream_job(spark, args.brokers, args.topic, args.out_topic or None, top_n=args.top,
                        min_partitions=args.min_partitions)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
