#!/usr/bin/env python3
"""Another team's service, written with the official CloudEvents SDK for
Python over the plain clients of Kafka (confluent-kafka), RabbitMQ (pika)
and NATS (nats-py).

    cloudevents_client.py read kafka|rabbitmq|nats URL ADDRESS COUNT

reads CloudEvents from a Kafka topic, a RabbitMQ exchange or a NATS subject
prefix: it prints `ready` once it listens (anything published after that
line reaches it), then one JSON line per event as the SDK understood it:
{"mode", "key", "attributes", "data"}. It exits non-zero, naming what is
missing, when fewer than COUNT events arrive within 30 seconds.

    cloudevents_client.py write kafka|rabbitmq|nats URL ADDRESS

writes what a foreign producer would (see `foreign_events`) to a Kafka
topic, a RabbitMQ exchange (routing key `0.<type>`) or a NATS subject
prefix (subject `<prefix>.0.<type>`), each confirmed by the broker, and
prints one JSON line per record written.

    cloudevents_client.py write-plain kafka|rabbitmq|nats URL ADDRESS

writes plain JSON records, no CloudEvents (see `plain_records`), where
`write` writes, and prints one JSON line per record written.

    cloudevents_client.py fill kafka URL TOPIC COUNT PARTITIONS

creates the Kafka topic TOPIC with PARTITIONS partitions, as another team
would, and writes COUNT binary-mode events to it (ids `evt_fill_<n>`, 40
keys), placed by the client's own partitioner; prints how many records
each partition got as one JSON object.
"""

import asyncio
import json
import signal
import sys
import time

from cloudevents.core.bindings import http, kafka, rabbitmq
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

FORMAT = JSONFormat()
WAIT_SECONDS = 30
GIVE_UP_SECONDS = 90


def as_sent(attributes, data):
    """The SDK's event, without the `time` it adds to events that have none."""
    had_time = "time" in attributes
    event = CloudEvent(attributes, data)
    if not had_time:
        event.get_attributes().pop("time", None)
    return event


def emit(event, mode, key=None):
    attributes = dict(event.get_attributes())
    if attributes.get("time") is not None:
        attributes["time"] = attributes["time"].isoformat()
    data = event.get_data()
    if isinstance(data, (bytes, bytearray)):
        data = {"base64": __import__("base64").b64encode(data).decode()}
    line = {"mode": mode, "key": key, "attributes": attributes, "data": data}
    print(json.dumps(line, default=str), flush=True)


def ready():
    print("ready", flush=True)


def short(got, count):
    sys.exit(f"only {got} of {count} events arrived within {WAIT_SECONDS} s")


def read_kafka(url, topic, count):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": url.split("://", 1)[-1],
            "group.id": "foreign-cloudevents-reader",
            "enable.auto.commit": False,
        }
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    ready()
    got, deadline = 0, time.time() + WAIT_SECONDS
    while got < count:
        if time.time() > deadline:
            short(got, count)
        record = consumer.poll(1.0)
        if record is None:
            continue
        if record.error():
            print(f"Kafka: {record.error()}", file=sys.stderr, flush=True)
            continue
        headers = dict(record.headers() or [])
        message = kafka.KafkaMessage(headers=headers, key=record.key(), value=record.value())
        mode = "binary" if any(k.startswith("ce_") for k in headers) else "structured"
        key = record.key().decode() if record.key() is not None else None
        emit(kafka.from_kafka(message, FORMAT, event_factory=as_sent), mode, key)
        got += 1
    consumer.close()


def read_rabbitmq(url, exchange, count):
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, exchange, routing_key="#")
    ready()
    got, deadline = 0, time.time() + WAIT_SECONDS
    for method, properties, body in channel.consume(queue, auto_ack=True, inactivity_timeout=1):
        if got >= count:
            break
        if time.time() > deadline:
            short(got, count)
        if method is None:
            continue
        message = rabbitmq.RabbitMQMessage(
            headers=properties.headers or {},
            content_type=properties.content_type,
            body=body,
        )
        structured = (properties.content_type or "").startswith("application/cloudevents")
        event = rabbitmq.from_rabbitmq(message, FORMAT, event_factory=as_sent)
        emit(event, "structured" if structured else "binary")
        got += 1
        if got >= count:
            break
    connection.close()


async def read_nats(url, subject, count):
    import nats

    client = await nats.connect(url)
    subscription = await client.subscribe(subject + ".>")
    await client.flush()
    ready()
    deadline = time.time() + WAIT_SECONDS
    for got in range(count):
        try:
            msg = await subscription.next_msg(timeout=max(deadline - time.time(), 0.01))
        except Exception:
            short(got, count)
        headers = msg.headers or {}
        mode = "binary" if any(k.lower().startswith("ce-") for k in headers) else "structured"
        # The SDK has no NATS binding: NATS headers follow HTTP's.
        event = http.from_http(http.HTTPMessage(headers=headers, body=msg.data), FORMAT, event_factory=as_sent)
        emit(event, mode)
    await client.close()


SOURCE = "https://pay.example/hooks"
OTHER_SOURCE = "https://billing.example"
GARBAGE = b"not an event {"


def foreign_events():
    """(mode, event) pairs as another team's producer writes them: ids that
    are not UUIDs, no `time`, an extension of its own (`tenant`), one
    event without any key, an id another source already used, and the
    first event sent a second time (a retry of its producer)."""

    def event(event_id, source, key):
        attributes = {
            "id": event_id,
            "source": source,
            "type": "payment.succeeded",
            "datacontenttype": "application/json",
            "tenant": "acme",
        }
        if key is not None:
            attributes["partitionkey"] = key
        made = CloudEvent(attributes, {"payment": event_id, "amount": 1200})
        made.get_attributes().pop("time", None)
        return made

    first = event("evt_01J8K2A", SOURCE, "inv-1")
    return [
        ("binary", first),
        ("structured", event("evt_01J8K2B", SOURCE, "inv-1")),
        ("binary", event("evt_01J8K2C", SOURCE, None)),
        ("structured", event("evt_01J8K2A", OTHER_SOURCE, "inv-2")),
        ("binary", first),
    ]


def written(mode, event=None):
    what = {"mode": mode}
    if event is not None:
        what.update(id=event.get_id(), source=event.get_source())
    print(json.dumps(what), flush=True)


def plain_records():
    """(key, headers, body) of plain JSON records as a producer that knows
    nothing of CloudEvents writes them: the id in a header, the second
    record sent twice (a retry), one without its id, one that is not JSON."""
    def payment(n):
        return json.dumps({"payment_id": f"pay-{n}", "amount": 100 * n}).encode()

    return [
        ("acct-1", {"x-event-id": "pay-1"}, payment(1)),
        ("acct-1", {"x-event-id": "pay-2"}, payment(2)),
        ("acct-1", {"x-event-id": "pay-2"}, payment(2)),
        ("acct-2", {}, payment(3)),
        ("acct-2", {"x-event-id": "pay-4"}, GARBAGE),
    ]


def write_plain(broker, url, address):
    records = plain_records()
    if broker == "kafka":
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": url.split("://", 1)[-1], "enable.idempotence": True})
        failures = []
        for key, headers, body in records:
            producer.produce(
                address,
                key=key.encode(),
                value=body,
                headers=list(headers.items()),
                on_delivery=lambda error, _: error is not None and failures.append(str(error)),
            )
        if producer.flush(30) != 0 or failures:
            sys.exit(f"Kafka did not confirm every record: {failures}")
    elif broker == "rabbitmq":
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        channel.confirm_delivery()
        for _key, headers, body in records:
            properties = pika.BasicProperties(headers=headers, content_type="application/json", delivery_mode=2)
            channel.basic_publish(address, "0.plain", body, properties, mandatory=True)
        connection.close()
    elif broker == "nats":

        async def publish():
            import nats

            client = await nats.connect(url)
            stream = client.jetstream()
            for _key, headers, body in records:
                await stream.publish(f"{address}.0.plain", body, headers=headers or None)
            await client.close()

        asyncio.run(publish())
    else:
        sys.exit(f"unknown broker {broker!r} (kafka, rabbitmq or nats)")
    for key, headers, _body in records:
        print(json.dumps({"key": key, "id": headers.get("x-event-id")}), flush=True)


def write_kafka(url, topic):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": url.split("://", 1)[-1], "enable.idempotence": True})
    failures = []

    def report(error, _record):
        if error is not None:
            failures.append(str(error))

    for mode, event in foreign_events():
        message = (kafka.to_binary if mode == "binary" else kafka.to_structured)(event, FORMAT)
        producer.produce(
            topic, key=message.key, value=message.value, headers=list(message.headers.items()), on_delivery=report
        )
        written(mode, event)
    producer.produce(topic, value=GARBAGE, on_delivery=report)
    written("garbage")
    if producer.flush(30) != 0 or failures:
        sys.exit(f"Kafka did not confirm every record: {failures}")


def fill_kafka(url, topic, count, partitions):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    servers = url.split("://", 1)[-1]
    admin = AdminClient({"bootstrap.servers": servers})
    created = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    created[topic].result(30)
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
    failures, placed = [], {}

    def report(error, record):
        if error is not None:
            failures.append(str(error))
        else:
            placed[record.partition()] = placed.get(record.partition(), 0) + 1

    for n in range(count):
        attributes = {
            "id": f"evt_fill_{n}",
            "source": SOURCE,
            "type": "payment.succeeded",
            "datacontenttype": "application/json",
        }
        event = CloudEvent(attributes, {"payment": n})
        message = kafka.to_binary(event, FORMAT)
        key = f"acct-{n % 40}".encode()
        producer.produce(topic, key=key, value=message.value, headers=list(message.headers.items()), on_delivery=report)
        producer.poll(0)
    if producer.flush(30) != 0 or failures:
        sys.exit(f"Kafka did not confirm every record: {failures}")
    print(json.dumps({str(p): n for p, n in sorted(placed.items())}), flush=True)


def write_rabbitmq(url, exchange):
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    for mode, event in foreign_events():
        message = (rabbitmq.to_binary if mode == "binary" else rabbitmq.to_structured)(event, FORMAT)
        properties = pika.BasicProperties(
            headers=dict(message.headers), content_type=message.content_type, delivery_mode=2
        )
        channel.basic_publish(exchange, "0." + event.get_type(), message.body, properties, mandatory=True)
        written(mode, event)
    channel.basic_publish(exchange, "0.garbage", GARBAGE, pika.BasicProperties(delivery_mode=2), mandatory=True)
    written("garbage")
    connection.close()


async def write_nats(url, prefix):
    import nats

    client = await nats.connect(url)
    stream = client.jetstream()
    for mode, event in foreign_events():
        # The SDK has no NATS binding: NATS headers follow HTTP's.
        message = (http.to_binary if mode == "binary" else http.to_structured)(event, FORMAT)
        await stream.publish(f"{prefix}.0.payment", message.body, headers=dict(message.headers))
        written(mode, event)
    await stream.publish(f"{prefix}.0.garbage", GARBAGE)
    written("garbage")
    await client.close()


def main(argv):
    # Whatever a broker does (a connection that never opens, a blocked
    # publish), the client ends: the test waiting on it never hangs.
    signal.alarm(GIVE_UP_SECONDS)
    if len(argv) == 5 and argv[1] == "write":
        _, _, broker, url, address = argv
        if broker == "kafka":
            write_kafka(url, address)
        elif broker == "rabbitmq":
            write_rabbitmq(url, address)
        elif broker == "nats":
            asyncio.run(write_nats(url, address))
        else:
            sys.exit(f"unknown broker {broker!r} (kafka, rabbitmq or nats)")
        return
    if len(argv) == 5 and argv[1] == "write-plain":
        write_plain(argv[2], argv[3], argv[4])
        return
    if len(argv) == 7 and argv[1] == "fill" and argv[2] == "kafka":
        _, _, _, url, topic, count, partitions = argv
        fill_kafka(url, topic, int(count), int(partitions))
        return
    if len(argv) != 6 or argv[1] != "read":
        sys.exit(__doc__)
    _, _, broker, url, address, count = argv
    count = int(count)
    if broker == "kafka":
        read_kafka(url, address, count)
    elif broker == "rabbitmq":
        read_rabbitmq(url, address, count)
    elif broker == "nats":
        asyncio.run(read_nats(url, address, count))
    else:
        sys.exit(f"unknown broker {broker!r} (kafka, rabbitmq or nats)")


if __name__ == "__main__":
    main(sys.argv)
