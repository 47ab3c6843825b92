//! `tidings lag`: the figures that say whether the system keeps up, read
//! from the database or from a running daemon's console.

use tidings_core::LagReport;

use crate::daemon_client::Daemon;
use crate::dlq::shown;

/// Prints `report`, as one JSON object with `json`.
///
/// Names as they are read (from the database or a daemon) may hold
/// control characters: they are shown escaped.
pub(crate) fn print(report: &LagReport, json: bool) -> anyhow::Result<()> {
    if json {
        say!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    let age =
        |d: Option<std::time::Duration>| d.map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    say!("outbox pending      {}", report.outbox_pending);
    say!("oldest unsent age   {}", age(report.oldest_unsent_age));
    say!("dead letters        {}", report.dead_letters_pending());
    for d in &report.dead_letters {
        say!(
            "consumer {:<20} dead letters {} · oldest {}",
            shown(&d.consumer),
            d.pending,
            age(d.oldest_age)
        );
    }
    for c in &report.consumers {
        say!(
            "consumer {:<20} topic {:<20} pending {}",
            shown(&c.consumer),
            shown(&c.topic),
            c.pending
        );
    }
    for p in &report.parked {
        say!(
            "consumer {:<20} topic {:<20} held keys {} · parked {}",
            shown(&p.consumer),
            shown(&p.topic),
            p.held_keys,
            p.messages
        );
    }
    Ok(())
}

/// The figures as the daemon's console reads them.
pub(crate) async fn remote(daemon: &Daemon) -> anyhow::Result<LagReport> {
    daemon.get("/lag", &()).await
}
