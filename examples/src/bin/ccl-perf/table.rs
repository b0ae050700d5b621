//! nccl-tests' table: header and rows, shared by every backend.

use serde::Serialize;
use std::path::Path;

/// One measured mode (out of place or in place) of one size.
#[derive(Clone, Copy, Serialize)]
pub struct Mode {
    /// Slowest rank's time per call, microseconds.
    pub time_us: f64,
    /// Size / time, GB/s.
    pub algbw: f64,
    /// algbw × the collective's bus factor, GB/s.
    pub busbw: f64,
    /// Elements that differ from the predicted result.
    pub wrong: u64,
    /// Device calls: how long a call took to return on the host (the
    /// slowest rank's), microseconds; the GPU finishes it later.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_us: Option<f64>,
}

/// Prints the column headings; `host`: with each mode's host time per call.
fn header(host: bool) {
    let (h, u, w) = if host { ("host", "(us)", 8) } else { ("", "", 0) };
    println!("#{:>60}{:>w2$}", "out-of-place", "in-place", w2 = 34 + w);
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>5} {:>9} {:>7} {:>7} {:>6}{:>w$} {:>9} {:>7} {:>7} {:>6}{:>w$}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        h,
        "time",
        "algbw",
        "busbw",
        "#wrong",
        h,
    );
    println!(
        "# {:>10} {:>12} {:>31} {:>7} {:>7} {:>7}{:>w$} {:>8} {:>7} {:>7} {:>7}{:>w$}",
        "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "", u, "(us)", "(GB/s)", "(GB/s)", "", u
    );
}

/// A mode's host time column, where it has one.
fn host_col(m: &Mode) -> String {
    m.host_us.map(|h| format!("{h:>8.2}")).unwrap_or_default()
}

/// Prints one size's row.
fn row(bytes: usize, count: usize, ty: &str, redop: &str, root: i64, oop: &Mode, ip: &Mode) {
    println!(
        "  {:>10} {:>12} {:>8} {:>6} {:>5} {:>9.2} {:>7.2} {:>7.2} {:>6}{} {:>9.2} {:>7.2} {:>7.2} {:>6}{}",
        bytes,
        count,
        ty,
        redop,
        root,
        oop.time_us,
        oop.algbw,
        oop.busbw,
        oop.wrong,
        host_col(oop),
        ip.time_us,
        ip.algbw,
        ip.busbw,
        ip.wrong,
        host_col(ip),
    );
}

/// One size's measurements, as `--json` writes them.
#[derive(Serialize)]
struct Row {
    coll: &'static str,
    size: usize,
    count: usize,
    #[serde(rename = "type")]
    ty: String,
    redop: String,
    root: i64,
    ranks: usize,
    out_of_place: Mode,
    in_place: Mode,
}

/// A sweep's table: prints its rows (on the printing rank) and keeps them
/// for the footer and for `--json` and `--plot`.
pub struct Table {
    printer: bool,
    coll: &'static str,
    ranks: usize,
    rows: Vec<Row>,
}

impl Table {
    /// A table of `coll` on `ranks` ranks; `printer` prints (the header
    /// now); `host`: rows carry host times per call (device calls).
    pub fn new(printer: bool, coll: &'static str, ranks: usize, host: bool) -> Self {
        if printer {
            header(host);
        }
        Table { printer, coll, ranks, rows: Vec::new() }
    }

    /// One size's row.
    #[allow(clippy::too_many_arguments)]
    pub fn row(&mut self, bytes: usize, count: usize, ty: &str, redop: &str, root: i64, oop: &Mode, ip: &Mode) {
        if self.printer {
            row(bytes, count, ty, redop, root, oop, ip);
        }
        self.rows.push(Row {
            coll: self.coll,
            size: bytes,
            count,
            ty: ty.into(),
            redop: redop.into(),
            root,
            ranks: self.ranks,
            out_of_place: *oop,
            in_place: *ip,
        });
    }

    /// Elements wrong, all rows together.
    pub fn wrong(&self) -> u64 {
        self.rows.iter().map(|r| r.out_of_place.wrong + r.in_place.wrong).sum()
    }

    /// Prints nccl-tests' footer: wrong elements and the mean busbw.
    pub fn footer(&self) {
        if self.printer {
            let wrong = self.wrong();
            let bw: f64 = self.rows.iter().map(|r| r.out_of_place.busbw + r.in_place.busbw).sum();
            println!("# Out of bounds values : {wrong} {}", if wrong == 0 { "OK" } else { "FAILED" });
            println!("# Avg bus bandwidth    : {:.4}", bw / (2 * self.rows.len()).max(1) as f64);
        }
    }

    /// Writes what `--plot` (busbw against size, out of place and in place,
    /// each line named "`who` mode") and `--json` ask for, on the printing
    /// rank; the process exit code for a file that cannot be written.
    pub fn save(&self, plot: Option<&Path>, json: Option<&Path>, title: &str, who: &str) -> Result<(), i32> {
        if !self.printer {
            return Ok(());
        }
        let write = |path: &Path, text: String| {
            std::fs::write(path, text).map_err(|e| {
                eprintln!("ccl-perf: {}: {e}", path.display());
                1
            })
        };
        if let Some(path) = plot {
            let line = |mode: &str, of: fn(&Row) -> &Mode| ccl_examples::plot::Series {
                name: format!("{who} {mode}"),
                points: self.rows.iter().map(|r| (r.size, of(r).busbw)).collect(),
            };
            let lines = [line("out_of_place", |r| &r.out_of_place), line("in_place", |r| &r.in_place)];
            write(path, ccl_examples::plot::svg(title, &lines))?;
        }
        if let Some(path) = json {
            let doc = serde_json::json!({ "ranks": self.ranks, "backend": who, "results": self.rows });
            write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())?;
        }
        Ok(())
    }
}
