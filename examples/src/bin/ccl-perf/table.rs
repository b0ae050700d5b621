//! nccl-tests' table: header and rows, shared by every backend.

use std::path::Path;

/// One measured mode (out of place or in place) of one size.
pub struct Mode {
    /// Slowest rank's time per call, microseconds.
    pub time_us: f64,
    /// Size / time, GB/s.
    pub algbw: f64,
    /// algbw × the collective's bus factor, GB/s.
    pub busbw: f64,
    /// Elements that differ from the predicted result.
    pub wrong: u64,
}

/// Prints the column headings.
fn header() {
    println!("#{:>60}{:>34}", "out-of-place", "in-place");
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>5} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>10} {:>12} {:>31} {:>7} {:>7} {:>16} {:>7} {:>7}",
        "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "(us)", "(GB/s)", "(GB/s)"
    );
}

/// Prints one size's row.
fn row(bytes: usize, count: usize, ty: &str, redop: &str, root: i64, oop: &Mode, ip: &Mode) {
    println!(
        "  {:>10} {:>12} {:>8} {:>6} {:>5} {:>9.2} {:>7.2} {:>7.2} {:>6} {:>9.2} {:>7.2} {:>7.2} {:>6}",
        bytes,
        count,
        ty,
        redop,
        root,
        oop.time_us,
        oop.algbw,
        oop.busbw,
        oop.wrong,
        ip.time_us,
        ip.algbw,
        ip.busbw,
        ip.wrong
    );
}

/// A sweep's table: prints its rows (on the printing rank) and keeps them
/// for the footer and for `--json` and `--plot`.
pub struct Table {
    printer: bool,
    coll: &'static str,
    ranks: usize,
    rows: Vec<serde_json::Value>,
    bw_sum: f64,
    /// Elements wrong, all rows together.
    pub wrong: u64,
}

impl Table {
    /// A table of `coll` on `ranks` ranks; `printer` prints (the header now).
    pub fn new(printer: bool, coll: &'static str, ranks: usize) -> Self {
        if printer {
            header();
        }
        Table { printer, coll, ranks, rows: Vec::new(), bw_sum: 0.0, wrong: 0 }
    }

    /// One size's row.
    #[allow(clippy::too_many_arguments)]
    pub fn row(&mut self, bytes: usize, count: usize, ty: &str, redop: &str, root: i64, oop: &Mode, ip: &Mode) {
        if self.printer {
            row(bytes, count, ty, redop, root, oop, ip);
        }
        self.bw_sum += oop.busbw + ip.busbw;
        self.wrong += oop.wrong + ip.wrong;
        let m =
            |x: &Mode| serde_json::json!({"time_us": x.time_us, "algbw": x.algbw, "busbw": x.busbw, "wrong": x.wrong});
        self.rows.push(serde_json::json!({
            "coll": self.coll, "size": bytes, "count": count, "type": ty, "redop": redop,
            "root": root, "ranks": self.ranks, "out_of_place": m(oop), "in_place": m(ip)
        }));
    }

    /// Prints nccl-tests' footer: wrong elements and the mean busbw.
    pub fn footer(&self) {
        if self.printer {
            let wrong = self.wrong;
            println!("# Out of bounds values : {wrong} {}", if wrong == 0 { "OK" } else { "FAILED" });
            println!("# Avg bus bandwidth    : {:.4}", self.bw_sum / (2 * self.rows.len()).max(1) as f64);
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
            let line = |mode: &str| ccl_examples::plot::Series {
                name: format!("{who} {mode}"),
                points: self
                    .rows
                    .iter()
                    .filter_map(|r| Some((r["size"].as_u64()? as usize, r[mode]["busbw"].as_f64()?)))
                    .collect(),
            };
            write(path, ccl_examples::plot::svg(title, &[line("out_of_place"), line("in_place")]))?;
        }
        if let Some(path) = json {
            let doc = serde_json::json!({ "ranks": self.ranks, "backend": who, "results": self.rows });
            write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())?;
        }
        Ok(())
    }
}
