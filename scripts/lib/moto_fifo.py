"""Brings moto's SQS FIFO queues closer to SQS on the points the test suite
depends on. Loaded by moto's server only (see `ensure_moto` in
services.sh, which installs it into moto's virtualenv with a .pth file).

1. A receive first takes every message whose visibility timeout ran out
   out of the in-flight set, and only then reads which message groups are
   in flight. Moto takes them out one by one while it walks the queue: of
   two expired messages of one group, it skips the first (its group still
   looks in flight because of the second) and delivers the second, out of
   order. And receives of one queue take turns: moto serves each request
   on a thread of its own, and two receives at once could split a message
   group (one hands out the group's first message while the other, having
   read the groups in flight before that, hands out its second). A
   receive that waits for messages looks again every 50 ms, letting
   others have their turn in between.
2. Changing the visibility of a message that is not in flight (its
   visibility timeout ran out) fails with MessageNotInflight, as on SQS.
   Moto hides it again without marking its group in flight, and the
   group's next message is delivered before it.

3. Deleting a message does not lose another sent at the same moment.
   Moto deletes by building a new list of the queue's messages without
   the deleted one and putting it in place of the old: a message added
   to the old list in between (sent, or delivered from an SNS topic, on
   another request's thread) was gone, with its send confirmed, and of
   two deletes at once the later one brought the earlier one's message
   back. Deletes, purges and receives (which move messages received too
   often to a dead-letter queue) now hold the lock sends append under.

And two changes of speed alone, without which a few thousand messages in
a queue bring moto's server to a crawl (each costs a walk of the whole
queue, or a calendar computation, per message received):

4. A receive checks a message's retention period against the queue's
   setting, not against a copy of every attribute of the queue (moto
   counts the queue's messages three times to make that copy).
5. The clock SQS reads is the system's, in seconds and milliseconds since
   the epoch, as before, without going through calendar dates.
"""

import os
import sys
import threading
import time


def _install():
    from moto.core.exceptions import ServiceException
    from moto.sqs import models
    from moto.sqs.exceptions import ReceiptHandleIsInvalid

    class MessageNotInflight(ReceiptHandleIsInvalid):
        # A ReceiptHandleIsInvalid for moto's batch handler, which reports
        # it as a failed entry; its own code when changed alone.
        def __init__(self):
            ServiceException.__init__(
                self, "MessageNotInflight", "The message referred to isn't in flight."
            )

    backend = models.SQSBackend
    receive = backend.receive_message
    change = backend.change_message_visibility
    purge = backend.purge_queue
    queue_delete = models.Queue.delete_message

    locks = {}
    locks_lock = threading.Lock()

    def turn(queue):
        with locks_lock:
            return locks.setdefault(id(queue), threading.Lock())

    def receive_message(
        self,
        queue_name,
        count,
        wait_seconds_timeout,
        visibility_timeout,
        message_attribute_names=None,
    ):
        queue = self.get_queue(queue_name)
        deadline = time.monotonic() + int(wait_seconds_timeout or 0)
        while True:
            with turn(queue):
                # A copy first: settlements change the set meanwhile.
                for message in [m for m in list(queue.pending_messages) if m.visible]:
                    queue.pending_messages.discard(message)
                with queue._messages_lock:
                    result = receive(
                        self, queue_name, count, 0, visibility_timeout, message_attribute_names
                    )
            if result or time.monotonic() >= deadline:
                return result
            time.sleep(0.05)

    def change_message_visibility(self, queue_name, receipt_handle, visibility_timeout):
        queue = self.get_queue(queue_name)
        for message in queue._messages:
            if message.had_receipt_handle(receipt_handle):
                if message.visible:
                    queue.pending_messages.discard(message)
                    raise MessageNotInflight()
                break
        return change(self, queue_name, receipt_handle, visibility_timeout)

    def delete_queue_message(self, receipt_handle):
        with self._messages_lock:
            return queue_delete(self, receipt_handle)

    def purge_queue(self, queue_name):
        with self.get_queue(queue_name)._messages_lock:
            return purge(self, queue_name)

    def is_message_valid_based_on_retention_period(self, queue_name, message):
        retention = int(self.get_queue(queue_name).message_retention_period)
        return retention + message.sent_timestamp / 1000 > time.time()

    unix_time = models.unix_time

    def seconds(dt=None):
        return time.time() if dt is None else unix_time(dt)

    def millis(dt=None):
        return seconds(dt) * 1000.0

    models.Queue.delete_message = delete_queue_message
    backend.receive_message = receive_message
    backend.purge_queue = purge_queue
    backend.change_message_visibility = change_message_visibility
    backend.is_message_valid_based_on_retention_period = (
        is_message_valid_based_on_retention_period
    )
    models.unix_time = seconds
    models.unix_time_millis = millis


if os.path.basename(sys.argv[0] if sys.argv else "") == "moto_server":
    _install()
