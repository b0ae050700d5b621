//! Bus bandwidth against size as an SVG line chart (no dependencies):
//! log₂ sizes across, GB/s up, one line per series.

use std::fmt::Write;

/// One line: a name and (bytes, GB/s) points.
#[derive(Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (size in bytes, bus bandwidth in GB/s), sizes ascending.
    pub points: Vec<(usize, f64)>,
}

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;
const COLOURS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{}G", b >> 30),
        b if b >= 1 << 20 => format!("{}M", b >> 20),
        b if b >= 1 << 10 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The chart as an SVG document.
pub fn svg(title: &str, series: &[Series]) -> String {
    let pts = || series.iter().flat_map(|s| s.points.iter()).filter(|p| p.0 > 0 && p.1.is_finite());
    let lx = |b: usize| (b.max(1) as f64).log2();
    let (x0, x1) = pts().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(lx(p.0)), b.max(lx(p.0))));
    let (x0, x1) = if x0 > x1 {
        (0.0, 1.0)
    } else if x0 == x1 {
        (x0 - 1.0, x1 + 1.0)
    } else {
        (x0, x1)
    };
    let ymax = pts().fold(0.0f64, |m, p| m.max(p.1)).max(1e-9) * 1.1;
    let px = |b: usize| LEFT + (lx(b) - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    let py = |v: f64| H - BOTTOM - v / ymax * (H - TOP - BOTTOM);
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(o, r#"<text x="{}" y="22" font-size="14" text-anchor="middle">{}</text>"#, W / 2.0, escape(title));
    // axes, ticks and grid
    let (l, r, t, b) = (LEFT, W - RIGHT, TOP, H - BOTTOM);
    let _ = writeln!(o, r#"<path d="M{l} {t} V{b} H{r}" stroke="black" fill="none"/>"#);
    let step = ((x1 - x0) / 10.0).ceil().max(1.0) as i64;
    let mut e = x0.ceil() as i64;
    while e as f64 <= x1 {
        let x = px(1usize << e.clamp(0, 62));
        let _ = writeln!(o, r##"<line x1="{x}" y1="{t}" x2="{x}" y2="{b}" stroke="#eee"/>"##);
        let _ = writeln!(
            o,
            r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
            b + 16.0,
            human(1usize << e.clamp(0, 62))
        );
        e += step;
    }
    for k in 0..=5 {
        let v = ymax / 1.1 * k as f64 / 5.0;
        let y = py(v);
        let _ = writeln!(o, r##"<line x1="{l}" y1="{y}" x2="{r}" y2="{y}" stroke="#eee"/>"##);
        let _ = writeln!(o, r#"<text x="{}" y="{}" text-anchor="end">{v:.2}</text>"#, l - 6.0, y + 4.0);
    }
    let _ = writeln!(o, r#"<text x="{}" y="{}" text-anchor="middle">size (bytes)</text>"#, (l + r) / 2.0, H - 14.0);
    let _ = writeln!(
        o,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">busbw (GB/s)</text>"#,
        (t + b) / 2.0,
        (t + b) / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.0 > 0 && p.1.is_finite())
            .enumerate()
            .map(|(k, p)| format!("{}{:.1} {:.1}", if k == 0 { "M" } else { "L" }, px(p.0), py(p.1)))
            .collect();
        let _ = writeln!(o, r#"<path d="{}" stroke="{c}" stroke-width="2" fill="none"/>"#, path.join(" "));
        let y = t + 16.0 * i as f64 + 8.0;
        let _ = writeln!(
            o,
            r#"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="{c}" stroke-width="2"/>"#,
            r + 12.0,
            r + 32.0
        );
        let _ = writeln!(o, r#"<text x="{}" y="{}">{}</text>"#, r + 38.0, y + 4.0, escape(&s.name));
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_series_and_escapes_names() {
        let s = vec![
            Series { name: "ring".into(), points: vec![(8, 0.01), (1 << 20, 3.0), (64 << 20, 5.5)] },
            Series { name: "a<b".into(), points: vec![(8, 0.02), (1 << 20, f64::NAN)] },
        ];
        let out = svg("all_reduce & co", &s);
        assert!(out.starts_with("<svg") && out.trim_end().ends_with("</svg>"));
        assert_eq!(out.matches("stroke-width=\"2\" fill=\"none\"").count(), 2);
        assert!(
            out.contains("a&lt;b")
                && out.contains("all_reduce &amp; co")
                && out.contains(">16M<")
                && out.contains(">8<")
        );
        assert!(!out.contains("NaN"));
        // nothing to draw is still a valid document
        assert!(svg("empty", &[]).contains("</svg>"));
    }
}
