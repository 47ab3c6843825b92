//! The overview: the whole pipeline at a glance, with the last hour of
//! its figures.

use axum::extract::State;
use maud::{Markup, html};

use super::{Page, age, layout, urlencode, when};
use crate::api::{ApiError, Reading};
use crate::history::{self, Sample};
use crate::overview::{GroupRow, Overview, PendingFrom};
use crate::{Console, ConsoleStore};

pub(super) async fn overview<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
) -> Page {
    let Reading(viewer) = reading?;
    let o = console.overview().await?;
    let samples = console.history.samples();
    Ok(layout("Overview", "/", &viewer, overview_page(&o, &samples)))
}

/// The last hour of one figure, as a small chart, when there is more than one sample.
fn trend(samples: &[Sample], figure: impl Fn(&Sample) -> Option<f64>) -> Markup {
    let values: Vec<f64> = samples.iter().filter_map(figure).collect();
    html! {
        @if values.len() > 1 { span.trend { (history::sparkline(&values)) } }
    }
}

fn overview_page(o: &Overview, samples: &[Sample]) -> Markup {
    let waiting = o.dead_letters_pending();
    let published = samples.last().and_then(|s| s.published_per_second);
    html! {
        h1 { "Overview" }
        p.muted { "Read at " (when(o.at)) ". " a href="/" { "Refresh" } }
        section.figures {
            div.figure data-figure="outbox-pending" {
                span.value { (o.outbox_pending) } span.label { "outbox pending" }
                (trend(samples, |s| Some(s.outbox_pending as f64)))
            }
            div.figure data-figure="oldest-unsent" {
                span.value { (age(o.oldest_unsent_seconds)) } span.label { "oldest unsent" }
                (trend(samples, |s| Some(s.oldest_unsent_seconds)))
            }
            div.figure data-figure="published-rate" {
                span.value { (published.map_or("-".to_owned(), |r| format!("{r:.0}/s"))) } span.label { "published" }
                (trend(samples, |s| s.published_per_second))
            }
            div.figure.warn[waiting > 0] data-figure="dead-letters" {
                span.value { a href="/dead-letters" { (waiting) } } span.label { "dead letters waiting" }
                (trend(samples, |s| Some(s.dead_letters as f64)))
            }
            div.figure data-figure="relays" { span.value { (o.relays.len()) } span.label { "relays running" } }
        }
        h2 { "Outbox partitions" }
        table #partitions {
            thead { tr { th { "partition" } th.num { "pending" } th.num { "oldest" } th { "relay" } } }
            tbody {
                @for p in &o.partitions {
                    tr {
                        td { (p.partition) }
                        td.num { (p.pending) }
                        td.num { (age(p.oldest_seconds)) }
                        td { @match &p.relay { Some(r) => code { (r) }, None => span.warn { "none" } } }
                    }
                }
            }
        }
        h2 { "Consumer groups" }
        @if o.groups.is_empty() {
            p.muted { "No consumer group has a member, a lag figure or a held key." }
        } @else {
            table #groups {
                thead { tr { th { "group" } th { "topic" } th.num { "pending" } th { "last hour" } th.num { "handled/s" } th.num { "held keys" } th.num { "parked" } th { "members (partitions)" } } }
                tbody {
                    @for (i, g) in o.groups.iter().enumerate() {
                        tr {
                            td { (g.group) }
                            td { (g.topic) }
                            td.num { (pending(g)) }
                            td {
                                @let name = format!("{}@{}", g.group, g.topic);
                                (trend(samples, |s| s.groups.get(&name).map(|n| *n as f64)))
                            }
                            // The rate is the group's, over every topic it reads: once per group.
                            @if i == 0 || o.groups[i - 1].group != g.group {
                                @let topics = o.groups[i..].iter().take_while(|h| h.group == g.group).count();
                                td.num rowspan=(topics) {
                                    @match g.handled_per_second {
                                        Some(r) => (format!("{r:.1}")),
                                        None => span.muted title="not sampled yet" { "-" },
                                    }
                                }
                            }
                            td.num.warn[g.held_keys > 0] { (g.held_keys) }
                            td.num { (g.parked) }
                            td {
                                @if g.members.is_empty() { span.warn { "none running" } }
                                @for m in &g.members {
                                    div { code { (m.member) } " " span.muted { (partitions(&m.partitions)) } }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Dead letters waiting" }
        @if o.dead_letters.is_empty() {
            p.muted { "None." }
        } @else {
            table #dead-letters {
                thead { tr { th { "consumer" } th.num { "waiting" } th.num { "oldest" } } }
                tbody {
                    @for d in &o.dead_letters {
                        tr {
                            td { a href={ "/dead-letters?consumer=" (urlencode(&d.consumer)) } { (d.consumer) } }
                            td.num { (d.pending) }
                            td.num { (age(d.oldest_seconds)) }
                        }
                    }
                }
            }
        }
        h2 { "Relays" }
        @if o.relays.is_empty() {
            p.warn { "No relay is running: nothing committed is being published." }
        } @else {
            table #relays {
                thead { tr { th { "relay" } th { "partitions" } th.num { "lease left" } } }
                tbody {
                    @for r in &o.relays {
                        tr {
                            td { code { (r.member) } }
                            td { (partitions(&r.partitions)) }
                            td.num { (age(Some(r.expires_in_seconds))) }
                        }
                    }
                }
            }
        }
        @if !o.relay_holds.is_empty() {
            h2 { "Keys the relay holds" }
            table #relay-holds {
                thead { tr { th { "record" } th { "topic" } th { "key" } th.num { "waiting behind" } } }
                tbody {
                    @for h in &o.relay_holds {
                        tr { td { (h.seq) } td { (h.topic) } td { (h.aggregate_key) } td.num { (h.waiting) } }
                    }
                }
            }
        }
        @if !o.slots.is_empty() {
            h2 { "Replication slots" }
            table #slots {
                thead { tr { th { "slot" } th { "reader" } th.num { "log kept" } } }
                tbody {
                    @for s in &o.slots {
                        tr {
                            td { (s.name) }
                            td { @if s.active { "connected" } @else { span.warn { "none" } } }
                            td.num { (format!("{:.1} MiB", s.retained_bytes as f64 / 1048576.0)) }
                        }
                    }
                }
            }
        }
    }
}

/// A group's pending count, saying where it comes from.
fn pending(g: &GroupRow) -> Markup {
    match (g.pending, g.pending_from) {
        (Some(n), Some(PendingFrom::Broker)) => html! {
            (n) " " abbr.muted title={ "counted on the broker " (age(g.counted_seconds_ago)) " ago" } { "broker" }
        },
        (Some(n), _) => html! { (n) },
        (None, _) => html! {
            span.muted title="not counted: the database log's groups are counted by the store, a broker's by the daemon's sampler (Pub/Sub counts a backlog only in Cloud Monitoring)" { "-" }
        },
    }
}

fn partitions(p: &[u32]) -> String {
    if p.is_empty() {
        return "standing by".to_owned();
    }
    p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}
