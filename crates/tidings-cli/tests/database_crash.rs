//! The database as an unlucky operator has it, on private PostgreSQL
//! servers: it crashes (SIGKILL of the server and all its backends) while
//! the one-process demo places orders, and starts again: the producers
//! wait out the outage and try their transactions again, the relay and the
//! consumers retry, and nothing is lost, reordered or applied twice. And a
//! server with few connections: the demo, sized to fit, gets through.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use tidings::sqlx;
use tidings_testkit::postgres::PrivatePostgres;

/// Checkout requests committed so far (0 before the demo created its tables).
async fn committed(url: &str) -> i64 {
    let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(url).await else {
        return 0;
    };
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM checkout_requests")
        .fetch_one(&mut conn)
        .await
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_survives_its_database_crashing_mid_run() {
    let mut pg = tokio::task::spawn_blocking(PrivatePostgres::start).await.unwrap();
    let url = pg.url();
    let started = Instant::now();
    let demo = common::tidings()
        .env("RUST_LOG", "error")
        .args([
            "demo",
            "checkout",
            "--orders",
            "1500",
            "--json",
            "--database",
            &url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running tidings");
    // Crash it while orders are being placed.
    let deadline = Instant::now() + Duration::from_secs(120);
    let before = loop {
        let n = committed(&url).await;
        if n >= 300 {
            break n;
        }
        assert!(Instant::now() < deadline, "the demo placed no orders");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let crashed = Instant::now();
    pg = tokio::task::spawn_blocking(move || {
        pg.crash();
        std::thread::sleep(Duration::from_secs(2));
        pg.resume();
        pg
    })
    .await
    .unwrap();
    let outage = crashed.elapsed();
    let out = tokio::task::spawn_blocking(move || demo.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the demo died:\n{stderr}\n{stdout}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("the JSON summary");
    let figures = format!(
        "fault suite · database crash (one-process demo on a private PostgreSQL, SIGKILL of the server)\n  \
         {} orders, crashed after {before} commands, down {:.1} s, lost {}, order violations {}, \
         duplicated effects {}, {:.1} s in all\n",
        summary["orders_placed"],
        outage.as_secs_f64(),
        summary["lost"],
        summary["order_violations"],
        summary["duplicated_effects"],
        started.elapsed().as_secs_f64()
    );
    println!("{figures}");
    // Printed by the test script with the fault suite's other figures.
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fault-suite-database-crash.txt");
    std::fs::write(out, &figures).unwrap();
    assert_eq!(summary["orders_placed"], 1500, "{stdout}");
    assert_eq!(summary["commands_committed"], 4500, "{stdout}");
    assert_eq!(summary["lost"], 0, "{stdout}");
    assert_eq!(summary["order_violations"], 0, "{stdout}");
    assert_eq!(summary["duplicated_effects"], 0, "{stdout}");
    drop(pg);
}

/// A server that allows 10 connections: the demo's pool, sized to 6 for
/// its producers, relay and five consumers, shares them and finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_sized_by_max_connections_fits_a_small_server() {
    let pg = tokio::task::spawn_blocking(|| PrivatePostgres::with_max_connections(10))
        .await
        .unwrap();
    let url = pg.url();
    let out = tokio::task::spawn_blocking(move || {
        common::tidings()
            .env("RUST_LOG", "error")
            .args([
                "demo",
                "checkout",
                "--orders",
                "200",
                "--json",
                "--max-connections",
                "6",
            ])
            .args(["--database", &url])
            .output()
            .expect("running tidings")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("the JSON summary");
    assert_eq!(summary["orders_placed"], 200, "{stdout}");
    assert_eq!(summary["lost"], 0, "{stdout}");

    // Every connection taken: a command says so, and what to do.
    let mut held = Vec::new();
    while let Ok(conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&pg.url()).await {
        held.push(conn);
        assert!(held.len() <= 10, "the server gave more than its 10 connections");
    }
    let out = common::tidings()
        .args(["outbox", "status", "--database", &pg.url()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no connection left: raise its max_connections, or lower the pools"),
        "{stderr}"
    );
    drop(held);
    drop(pg);
}
