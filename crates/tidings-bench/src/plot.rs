//! The latency distributions as an SVG plot: one curve per transport, mode
//! and rate, the share of events (y) handled within a latency (x, log scale).

use std::fmt::Write as _;

use super::Latencies;

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 260.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
/// The x axis, in milliseconds: 0.1 ms to 10 s.
const DECADES: (i32, i32) = (-1, 4);
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn x_of(ms: f64) -> f64 {
    let (lo, hi) = (f64::from(DECADES.0), f64::from(DECADES.1));
    let t = (ms.max(1e-3).log10() - lo) / (hi - lo);
    LEFT + t.clamp(0.0, 1.0) * (WIDTH - LEFT - RIGHT)
}

fn y_of(share: f64) -> f64 {
    TOP + (1.0 - share) * (HEIGHT - TOP - BOTTOM)
}

/// The plot of every run of `latencies`.
pub(crate) fn latency_svg(latencies: &[&Latencies]) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="18" font-size="14">Commit-to-handler latency: share of events handled within x</text>"#
    );
    for decade in DECADES.0..=DECADES.1 {
        let ms = 10f64.powi(decade);
        let x = x_of(ms);
        let label = if ms < 1.0 {
            format!("{ms}")
        } else {
            format!("{ms:.0}")
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label} ms</text>"##,
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 18.0
        );
    }
    for share in [0.0, 0.5, 0.9, 0.99, 1.0] {
        let y = y_of(share);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}%</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            share * 100.0
        );
    }
    let mut curve = 0;
    for latency in latencies {
        for run in &latency.runs {
            let colour = COLOURS[curve % COLOURS.len()];
            let dash = if run.mode == "polling" {
                r#" stroke-dasharray="6 3""#
            } else {
                ""
            };
            let points = run
                .distribution_ms
                .iter()
                .map(|(share, ms)| format!("{:.1},{:.1}", x_of(*ms), y_of(*share)))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.6"{dash} points="{points}"/>"#
            );
            let y = TOP + 10.0 + curve as f64 * 18.0;
            let x = WIDTH - RIGHT + 14.0;
            let _ = writeln!(
                svg,
                r#"<line x1="{x}" y1="{y}" x2="{:.1}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}, {}, {}/s</text>"#,
                x + 24.0,
                x + 30.0,
                y + 4.0,
                short(&latency.transport),
                run.mode,
                run.rate
            );
            curve += 1;
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// The transport's name without its address.
fn short(transport: &str) -> &str {
    transport.split(" (").next().unwrap_or(transport)
}
