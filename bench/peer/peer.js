// The peer's side of `tidings bench peer`: pg-transactional-outbox's polling
// listener relays an outbox to RabbitMQ, each message published with a
// confirmation, the same way Tidings' relay is measured. Prints one JSON
// object on stdout. Settings come from the environment (see `settings`).
'use strict';

const crypto = require('node:crypto');
const amqp = require('amqplib');
const { Pool } = require('pg');
const {
  DatabaseSetup,
  getDefaultLogger,
  getDisabledLogger,
  initializeMessageStorage,
  initializePollingMessageListener,
} = require('pg-transactional-outbox');

const settings = {
  mode: process.env.PEER_MODE || 'drain', // drain | latency
  database: process.env.PEER_DATABASE_URL,
  amqp: process.env.PEER_AMQP_URL,
  events: Number(process.env.PEER_EVENTS || 20000),
  rate: Number(process.env.PEER_RATE || 500),
  seconds: Number(process.env.PEER_SECONDS || 10),
  batch: Number(process.env.PEER_BATCH || 5), // the library's default, its best here
  pollMs: Number(process.env.PEER_POLL_MS || 100),
};

// PEER_LOG=1 shows the library's own log on stderr.
const logger = () => (process.env.PEER_LOG ? getDefaultLogger('peer') : getDisabledLogger());

const id = crypto.randomBytes(4).toString('hex');
const schema = `peer_${id}`;
const queue = `bench.peer.${id}`;
const note = 'an order-sized payload, about as large as a small business event';

const setup = {
  outboxOrInbox: 'outbox',
  database: new URL(settings.database).pathname.slice(1),
  schema,
  table: 'outbox',
  listenerRole: 'postgres',
  nextMessagesName: 'next_outbox_messages',
};

const listenerConfig = {
  outboxOrInbox: 'outbox',
  dbListenerConfig: { connectionString: settings.database },
  settings: {
    dbSchema: schema,
    dbTable: 'outbox',
    nextMessagesFunctionSchema: schema,
    nextMessagesFunctionName: 'next_outbox_messages',
    nextMessagesBatchSize: settings.batch,
    nextMessagesPollingIntervalInMs: settings.pollMs,
    enableMaxAttemptsProtection: true,
  },
};

const percentile = (sorted, q) =>
  sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))];

async function main() {
  const admin = new Pool({ connectionString: settings.database, max: 16 });
  await admin.query(DatabaseSetup.dropAndCreateTable(setup));
  await admin.query(DatabaseSetup.createPollingFunction(setup));
  await admin.query(DatabaseSetup.setupPollingIndexes(setup));

  const connection = await amqp.connect(settings.amqp);
  const channel = await connection.createConfirmChannel();
  await channel.assertQueue(queue, { durable: true });

  const confirmed = new Map(); // id -> time the broker confirmed it
  const handler = {
    handle: (message) =>
      new Promise((resolve, reject) => {
        const body = Buffer.from(JSON.stringify(message.payload));
        channel.sendToQueue(
          queue,
          body,
          { persistent: true, mandatory: true, messageId: message.id },
          (err) => {
            if (err) return reject(err);
            if (!confirmed.has(message.id)) confirmed.set(message.id, process.hrtime.bigint());
            resolve();
          },
        );
      }),
  };

  let result;
  try {
    if (settings.mode === 'drain') {
      result = await drain(admin, handler, confirmed);
    } else {
      result = await latency(admin, handler, confirmed);
    }
  } finally {
    await channel.deleteQueue(queue);
    await connection.close();
    await admin.query(`DROP SCHEMA ${schema} CASCADE`);
    await admin.end();
  }
  process.stdout.write(JSON.stringify(result) + '\n');
}

async function waitFor(done, what, limitMs) {
  const deadline = Date.now() + limitMs;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`${what}: not done within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

// A backlog of `events` (1000 keys, each its own segment, in order), then the listener drains it.
async function drain(admin, handler, confirmed) {
  const n = settings.events;
  await admin.query(
    `INSERT INTO ${schema}.outbox (id, aggregate_type, aggregate_id, message_type, segment, payload)
     SELECT gen_random_uuid(), 'bench', 'key-' || (i % 1000), 'BenchEvent', 'key-' || (i % 1000),
            jsonb_build_object('key', 'key-' || (i % 1000), 'seq', i, 'note', $1::text)
     FROM generate_series(0, $2::int - 1) AS i`,
    [note, n],
  );
  const started = process.hrtime.bigint();
  const [shutdown] = initializePollingMessageListener(listenerConfig, handler, logger());
  try {
    await waitFor(() => confirmed.size >= n, `draining ${n} events`, 300000);
  } finally {
    await shutdown();
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  return { mode: 'drain', events: n, batch: settings.batch, seconds, per_second: n / seconds };
}

// Events committed at `rate` for `seconds` through the library's storage
// function; from each commit's return to the broker's confirmation.
async function latency(admin, handler, confirmed) {
  const store = initializeMessageStorage(listenerConfig, logger());
  const [shutdown] = initializePollingMessageListener(listenerConfig, handler, logger());
  const committed = new Map();
  const total = Math.round(settings.rate * settings.seconds);
  const start = process.hrtime.bigint();
  const writes = [];
  try {
    for (let seq = 0; seq < total; seq++) {
      const due = start + BigInt(Math.round((seq * 1e9) / settings.rate));
      while (process.hrtime.bigint() < due) await new Promise((r) => setImmediate(r));
      writes.push(
        (async () => {
          const client = await admin.connect();
          const message = {
            id: crypto.randomUUID(),
            aggregateType: 'bench',
            aggregateId: `key-${seq % 1000}`,
            messageType: 'BenchEvent',
            segment: `key-${seq % 1000}`,
            payload: { key: `key-${seq % 1000}`, seq, note: 'latency probe' },
          };
          try {
            await client.query('BEGIN');
            await store(message, client);
            await client.query('COMMIT');
            committed.set(message.id, process.hrtime.bigint());
          } finally {
            client.release();
          }
        })(),
      );
    }
    await Promise.all(writes);
    await waitFor(() => confirmed.size >= total, `relaying ${total} events`, 120000);
  } finally {
    await shutdown();
  }
  const ms = [...committed]
    .map(([id, at]) => Number(confirmed.get(id) - at) / 1e6)
    .sort((a, b) => a - b);
  return {
    mode: 'latency',
    rate: settings.rate,
    events: ms.length,
    poll_ms: settings.pollMs,
    p50_ms: percentile(ms, 0.5),
    p90_ms: percentile(ms, 0.9),
    p99_ms: percentile(ms, 0.99),
    max_ms: ms[ms.length - 1],
  };
}

main().catch((e) => {
  process.stderr.write(`peer: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
