#!/usr/bin/env python3
"""Another team's service, written with the official CloudEvents SDK for
Python over the plain clients of Kafka (confluent-kafka), RabbitMQ (pika),
NATS (nats-py), Amazon SNS and SQS (boto3) and Google Cloud Pub/Sub
(google-cloud-pubsub).

    cloudevents_client.py read kafka|rabbitmq|nats|sqs|pubsub URL ADDRESS COUNT

reads CloudEvents from a Kafka topic, a RabbitMQ exchange, a NATS subject
prefix, an SNS FIFO topic or Pub/Sub topics: it prints `ready` once it
listens (anything published after that line reaches it), then one JSON
line per event as the SDK understood it: {"mode", "key", "attributes",
"data"}. It exits non-zero, naming what is missing, when fewer than COUNT
events arrive within 30 seconds.

On SNS (URL the endpoint, ADDRESS the topic's name; region us-east-1 and
the access key test/test, as moto takes them, unless AWS_REGION,
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY say otherwise) it reads
through a FIFO SQS queue of its own, subscribed to the topic with raw
message delivery, removed when it is done. On Pub/Sub (URL the emulator's
host and port, ADDRESS the topic paths `projects/P/topics/T`, several
separated by commas: one per partition of a Tidings topic) it reads
through a subscription of its own to each topic, removed when it is done.
Neither has a CloudEvents binding in the SDK: the message attributes are
read as the HTTP binding's headers (`ce-` attributes, `content-type`), and
the content type tells structured mode from binary mode. The key printed
is the SQS message group or the Pub/Sub ordering key.

    cloudevents_client.py write kafka|rabbitmq|nats|sqs|pubsub URL ADDRESS

writes what a foreign producer would (see `foreign_events`) to a Kafka
topic, a RabbitMQ exchange (routing key `0.<type>`), a NATS subject
prefix (subject `<prefix>.0.<type>`), an SNS FIFO topic or the first of
the Pub/Sub topics, each confirmed by the broker, and prints one JSON line
per record written. On SNS each message has the key as its message group
(the event id where it has none), a deduplication id made of the event's
source and id (SNS drops the producer's retry within five minutes), and
the message attribute `tidings-partition` = 0 (the partition its Tidings
group reads, as the routing key and subject above name it). On Pub/Sub
each has the key as its ordering key; each publish is awaited.

    cloudevents_client.py write-plain kafka|rabbitmq|nats|sqs|pubsub URL ADDRESS

writes plain JSON records, no CloudEvents (see `plain_records`), where
`write` writes, and prints one JSON line per record written. On SNS a
record's deduplication id is its id, or the SHA-256 of its body where it
has none.

    cloudevents_client.py own rabbitmq|nats URL NAME

makes what another team's producer owns and names itself: on RabbitMQ the
durable topic exchange NAME, on NATS the stream NAME (upper case) holding
the subjects `NAME.>`. `write` and `write-plain` then write there.

    cloudevents_client.py write-core nats URL PREFIX

writes the plain JSON records of `write-plain` with plain NATS (no
JetStream: nothing confirms them) on `PREFIX.0.plain`, flushed.

    cloudevents_client.py post-http URL TOKEN

posts CloudEvents over HTTP to URL as the SDK's HTTP binding writes them
(see `http_requests`: binary and structured mode, a batch, a retry, a
subject that is not ASCII) and what is not a CloudEvent or not
authenticated, with `Authorization: Bearer TOKEN` where it should be;
prints one JSON line per request: {"what", "status", "answer"}.

    cloudevents_client.py fill kafka URL TOPIC COUNT PARTITIONS

creates the Kafka topic TOPIC with PARTITIONS partitions, as another team
would, and writes COUNT binary-mode events to it (ids `evt_fill_<n>`, 40
keys), placed by the client's own partitioner; prints how many records
each partition got as one JSON object.

    cloudevents_client.py fill-clicks kafka URL TOPIC COUNT PARTITIONS

the same with COUNT clicks as a web tier writes them for the clicks
reference system (type `Click`, ids `clk_py_<n>`, `COUNT / 20` sessions
as keys, each session's clicks in order).
"""

import asyncio
import hashlib
import json
import os
import queue
import signal
import sys
import time
import uuid

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


def from_attributes(attributes, body):
    """(mode, event) of a message whose attributes stand for the HTTP
    binding's headers (SQS message attributes, Pub/Sub attributes): the
    content type tells the mode, as every CloudEvents binding tells it
    (attributes such as `ce-id` may come with a structured-mode message
    too, where they are repeated for filters and consoles)."""
    message = http.HTTPMessage(headers=attributes, body=body)
    content_type = next((v for k, v in attributes.items() if k.lower() == "content-type"), "")
    if content_type.lower().startswith("application/cloudevents"):
        return "structured", http.from_structured(message, FORMAT, event_factory=as_sent)
    return "binary", http.from_binary(message, FORMAT, event_factory=as_sent)


def aws_clients(url):
    """SNS and SQS clients at endpoint `url`."""
    import boto3

    session = boto3.session.Session(
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
    )
    return session.client("sns", endpoint_url=url), session.client("sqs", endpoint_url=url)


def sns_topic_arn(sns, url, name):
    """The ARN of the SNS topic called `name`, as a team given its name finds it."""
    for page in sns.get_paginator("list_topics").paginate():
        for topic in page.get("Topics", []):
            if topic["TopicArn"].rsplit(":", 1)[-1] == name:
                return topic["TopicArn"]
    sys.exit(f"SNS at {url} has no topic {name!r}")


def read_sqs(url, name, count):
    sns, sqs = aws_clients(url)
    topic_arn = sns_topic_arn(sns, url, name)
    queue_name = f"foreign-reader-{uuid.uuid4().hex[:12]}.fifo"
    queue_url = sqs.create_queue(QueueName=queue_name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    subscription = None
    try:
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "sns.amazonaws.com"},
                    "Action": "sqs:SendMessage",
                    "Resource": queue_arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": topic_arn}},
                }
            ],
        }
        sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps(policy)})
        subscription = sns.subscribe(
            TopicArn=topic_arn,
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "true"},
            ReturnSubscriptionArn=True,
        )["SubscriptionArn"]
        ready()
        got, deadline = 0, time.time() + WAIT_SECONDS
        while got < count:
            if time.time() > deadline:
                short(got, count)
            received = sqs.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=10,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["MessageGroupId"],
            ).get("Messages", [])
            if not received:
                time.sleep(0.2)
                continue
            for message in received:
                attributes = {}
                for k, v in message.get("MessageAttributes", {}).items():
                    if "StringValue" in v:
                        attributes[k] = v["StringValue"]
                    elif "BinaryValue" in v:
                        attributes[k] = v["BinaryValue"].decode()
                mode, event = from_attributes(attributes, message["Body"].encode())
                emit(event, mode, message.get("Attributes", {}).get("MessageGroupId"))
                got += 1
            sqs.delete_message_batch(
                QueueUrl=queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(received)],
            )
    finally:
        if subscription is not None:
            sns.unsubscribe(SubscriptionArn=subscription)
        sqs.delete_queue(QueueUrl=queue_url)


def pubsub(url):
    """Google's Pub/Sub client library, pointed at the emulator at `url`."""
    os.environ["PUBSUB_EMULATOR_HOST"] = url
    from google.cloud import pubsub_v1

    return pubsub_v1


def pubsub_publisher(url):
    """A Pub/Sub publisher with ordering keys on."""
    pubsub_v1 = pubsub(url)
    options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    return pubsub_v1.PublisherClient(publisher_options=options)


def pubsub_topics(address):
    """The Pub/Sub topic paths ADDRESS names, separated by commas."""
    topics = [t for t in address.split(",") if t]
    for topic in topics:
        if not topic.startswith("projects/") or "/topics/" not in topic:
            sys.exit(f"{topic!r} is not a Pub/Sub topic path (projects/PROJECT/topics/TOPIC)")
    return topics


def read_pubsub(url, address, count):
    from google.api_core.exceptions import NotFound

    subscriber = pubsub(url).SubscriberClient()
    arrived = queue.Queue()

    def take(message):
        arrived.put((dict(message.attributes), message.data, message.ordering_key))
        message.ack()

    subscriptions, pulls = [], []
    try:
        for topic in pubsub_topics(address):
            project = topic.split("/")[1]
            name = f"projects/{project}/subscriptions/foreign-reader-{uuid.uuid4().hex[:12]}"
            try:
                subscriber.create_subscription(
                    request={"name": name, "topic": topic, "enable_message_ordering": True, "ack_deadline_seconds": 10}
                )
            except NotFound:
                sys.exit(f"Pub/Sub at {url} has no topic {topic}")
            subscriptions.append(name)
        for name in subscriptions:
            pulls.append(subscriber.subscribe(name, callback=take))
        ready()
        deadline = time.time() + WAIT_SECONDS
        for got in range(count):
            try:
                attributes, data, key = arrived.get(timeout=max(deadline - time.time(), 0.01))
            except queue.Empty:
                short(got, count)
            mode, event = from_attributes(attributes, data)
            emit(event, mode, key or None)
    finally:
        for pull in pulls:
            pull.cancel()
            try:
                pull.result(timeout=10)
            except Exception:
                pass
        for name in subscriptions:
            subscriber.delete_subscription(request={"subscription": name})
        subscriber.close()


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
    elif broker == "sqs":
        sns, _ = aws_clients(url)
        topic_arn = sns_topic_arn(sns, url, address)
        for key, headers, body in records:
            deduplication = headers.get("x-event-id") or digest(body)
            sns_publish(sns, topic_arn, body, key, deduplication, headers)
    elif broker == "pubsub":
        publisher = pubsub_publisher(url)
        topic = pubsub_topics(address)[0]
        for key, headers, body in records:
            pubsub_publish(publisher, topic, body, key, headers)
    else:
        sys.exit(f"unknown broker {broker!r} (kafka, rabbitmq, nats, sqs or pubsub)")
    for key, headers, _body in records:
        print(json.dumps({"key": key, "id": headers.get("x-event-id")}), flush=True)


def own(broker, url, name):
    if broker == "rabbitmq":
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(url))
        connection.channel().exchange_declare(name, exchange_type="topic", durable=True)
        connection.close()
    elif broker == "nats":

        async def make():
            import nats

            client = await nats.connect(url)
            await client.jetstream().add_stream(name=name.upper(), subjects=[f"{name}.>"])
            await client.close()

        asyncio.run(make())
    else:
        sys.exit(f"`own` makes nothing on {broker!r} (rabbitmq or nats)")


def write_core(url, prefix):
    async def publish():
        import nats

        client = await nats.connect(url)
        for _key, headers, body in plain_records():
            await client.publish(f"{prefix}.0.plain", body, headers=headers or None)
        await client.flush()
        await client.close()

    asyncio.run(publish())


def http_requests(token):
    """(what, headers, body) of the requests `post-http` makes."""

    def event(event_id, source, key, **more):
        attributes = {
            "id": event_id,
            "source": source,
            "type": "invoice.paid",
            "datacontenttype": "application/json",
            "partitionkey": key,
            "tenant": "acme",
        }
        attributes.update(more)
        made = CloudEvent(attributes, {"invoice": key, "event": event_id})
        made.get_attributes().pop("time", None)
        return made

    def signed(headers):
        return dict(headers, Authorization=f"Bearer {token}")

    def batch(events):
        body = b"[" + b",".join(FORMAT.write(e) for e in events) + b"]"
        return {"Content-Type": "application/cloudevents-batch+json"}, body

    a = event("evt_http_A", SOURCE, "inv-1")
    b = event("evt_http_B", SOURCE, "inv-1")
    c = event("evt_http_C", SOURCE, "inv-2")
    a_elsewhere = event("evt_http_A", OTHER_SOURCE, "inv-3")
    d = event("evt_http_D", SOURCE, "cliente-ñ", subject="café ☕ 100%")
    e = event("evt_http_E", SOURCE, "inv-9")
    as_binary = http.to_binary(a, FORMAT)
    batch_headers, batch_body = batch([c, a_elsewhere, b])
    bad_headers, bad_body = batch([event("evt_http_F", SOURCE, "inv-4")])
    bad_body = bad_body[:-1] + b',{"specversion":"1.0","id":"x","source":"s"}]'
    plain = json.dumps({"invoice": "inv-5"}).encode()
    return [
        ("binary", signed(as_binary.headers), as_binary.body),
        ("structured", signed(http.to_structured(b, FORMAT).headers), http.to_structured(b, FORMAT).body),
        ("retry", signed(as_binary.headers), as_binary.body),
        ("batch", signed(batch_headers), batch_body),
        ("unicode", signed(http.to_binary(d, FORMAT).headers), http.to_binary(d, FORMAT).body),
        ("no-token", dict(http.to_binary(e, FORMAT).headers), http.to_binary(e, FORMAT).body),
        ("wrong-token", dict(http.to_binary(e, FORMAT).headers, Authorization="Bearer guess"), b"{}"),
        ("not-cloudevents", signed({"Content-Type": "application/json"}), plain),
        ("bad-batch", signed(bad_headers), bad_body),
        ("empty-batch", signed(batch([])[0]), b"[]"),
    ]


def post_http(url, token):
    import urllib.error
    import urllib.request

    for what, headers, body in http_requests(token):
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, answer = response.status, response.read()
        except urllib.error.HTTPError as refused:
            status, answer = refused.code, refused.read()
        try:
            answer = json.loads(answer)
        except ValueError:
            answer = answer.decode(errors="replace")
        print(json.dumps({"what": what, "status": status, "answer": answer}), flush=True)


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


def click_events(count):
    """(key, attributes, data) of `count` clicks over `count / 20` sessions,
    each session's clicks in order (seq from 1, time moving on)."""
    sessions = max(1, count // 20)
    seqs = [0] * sessions
    for n in range(count):
        s = (n * 7919) % sessions
        seqs[s] += 1
        session = f"sess_py_{s}"
        attributes = {
            "id": f"clk_py_{n}",
            "source": "web-tier",
            "type": "Click",
            "datacontenttype": "application/json",
            "partitionkey": session,
        }
        at_ms = 1_700_000_000_000 + s * 1_000_000 + seqs[s] * (120 if s % 10 == 0 else 1_500)
        data = {"click_id": f"clk_py_{n}", "session_id": session, "seq": seqs[s], "page": f"/p/{n % 50}", "at_ms": at_ms}
        yield session, attributes, data


def payment_events(count):
    """(key, attributes, data) of `count` payment events over 40 keys."""
    for n in range(count):
        attributes = {
            "id": f"evt_fill_{n}",
            "source": SOURCE,
            "type": "payment.succeeded",
            "datacontenttype": "application/json",
        }
        yield f"acct-{n % 40}", attributes, {"payment": n}


def fill_kafka(url, topic, count, partitions, events):
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

    for key, attributes, data in events(count):
        message = kafka.to_binary(CloudEvent(attributes, data), FORMAT)
        while True:
            try:
                producer.produce(
                    topic, key=key.encode(), value=message.value, headers=list(message.headers.items()), on_delivery=report
                )
                break
            except BufferError:
                producer.poll(0.1)
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


# The message attribute a Tidings group's partitioned queues filter on.
PARTITION_ATTRIBUTE = "tidings-partition"


def sns_publish(sns, topic_arn, body, group, deduplication, attributes):
    """Publishes one message to an SNS FIFO topic, with `attributes` as
    string message attributes and the partition Tidings groups read,
    confirmed by the message id SNS answers with."""
    values = {k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()}
    values[PARTITION_ATTRIBUTE] = {"DataType": "String", "StringValue": "0"}
    answer = sns.publish(
        TopicArn=topic_arn,
        Message=body.decode(),
        MessageGroupId=group,
        MessageDeduplicationId=deduplication,
        MessageAttributes=values,
    )
    if not answer.get("MessageId"):
        sys.exit(f"SNS did not confirm a message to {topic_arn}: {answer}")


def digest(data):
    return hashlib.sha256(data).hexdigest()


def write_sqs(url, name):
    sns, _ = aws_clients(url)
    topic_arn = sns_topic_arn(sns, url, name)
    for mode, event in foreign_events():
        # The SDK has no SNS binding: message attributes follow HTTP's headers.
        message = (http.to_binary if mode == "binary" else http.to_structured)(event, FORMAT)
        group = event.get_attributes().get("partitionkey") or event.get_id()
        deduplication = digest(f"{event.get_source()} {event.get_id()}".encode())
        sns_publish(sns, topic_arn, message.body, group, deduplication, message.headers)
        written(mode, event)
    sns_publish(sns, topic_arn, GARBAGE, "garbage", digest(GARBAGE), {})
    written("garbage")


def pubsub_publish(publisher, topic, data, key, attributes):
    """Publishes one message to a Pub/Sub topic and waits for its confirmation."""
    try:
        publisher.publish(topic, data, ordering_key=key, **attributes).result(timeout=30)
    except Exception as refused:
        sys.exit(f"Pub/Sub did not confirm a message to {topic}: {refused}")


def write_pubsub(url, address):
    publisher = pubsub_publisher(url)
    topic = pubsub_topics(address)[0]
    for mode, event in foreign_events():
        # The SDK has no Pub/Sub binding: attributes follow HTTP's headers.
        message = (http.to_binary if mode == "binary" else http.to_structured)(event, FORMAT)
        key = event.get_attributes().get("partitionkey") or ""
        pubsub_publish(publisher, topic, message.body, key, message.headers)
        written(mode, event)
    pubsub_publish(publisher, topic, GARBAGE, "", {})
    written("garbage")


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
        elif broker == "sqs":
            write_sqs(url, address)
        elif broker == "pubsub":
            write_pubsub(url, address)
        else:
            sys.exit(f"unknown broker {broker!r} (kafka, rabbitmq, nats, sqs or pubsub)")
        return
    if len(argv) == 5 and argv[1] == "write-plain":
        write_plain(argv[2], argv[3], argv[4])
        return
    if len(argv) == 4 and argv[1] == "post-http":
        post_http(argv[2], argv[3])
        return
    if len(argv) == 5 and argv[1] == "own":
        own(argv[2], argv[3], argv[4])
        return
    if len(argv) == 5 and argv[1] == "write-core" and argv[2] == "nats":
        write_core(argv[3], argv[4])
        return
    if len(argv) == 7 and argv[1] in ("fill", "fill-clicks") and argv[2] == "kafka":
        _, command, _, url, topic, count, partitions = argv
        events = click_events if command == "fill-clicks" else payment_events
        fill_kafka(url, topic, int(count), int(partitions), events)
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
    elif broker == "sqs":
        read_sqs(url, address, count)
    elif broker == "pubsub":
        read_pubsub(url, address, count)
    else:
        sys.exit(f"unknown broker {broker!r} (kafka, rabbitmq, nats, sqs or pubsub)")


if __name__ == "__main__":
    main(sys.argv)
