//! nccl-tests' table: header and rows, shared by every backend.

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
pub fn header() {
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
pub fn row(bytes: usize, count: usize, ty: &str, redop: &str, root: i64, oop: &Mode, ip: &Mode) {
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

/// What the footer sums over a sweep's rows.
#[derive(Default)]
pub struct Totals {
    bw_sum: f64,
    bw_n: usize,
    /// Elements wrong, all rows together.
    pub wrong: u64,
}

impl Totals {
    /// Counts one size's two modes.
    pub fn add(&mut self, oop: &Mode, ip: &Mode) {
        self.bw_sum += oop.busbw + ip.busbw;
        self.bw_n += 2;
        self.wrong += oop.wrong + ip.wrong;
    }

    /// Prints nccl-tests' footer: wrong elements and the mean busbw.
    pub fn footer(&self) {
        let wrong = self.wrong;
        println!("# Out of bounds values : {wrong} {}", if wrong == 0 { "OK" } else { "FAILED" });
        println!("# Avg bus bandwidth    : {:.4}", self.bw_sum / self.bw_n.max(1) as f64);
    }
}
