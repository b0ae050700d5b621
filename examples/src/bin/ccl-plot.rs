//! ccl-plot: the chart of `ccl-perf --plot` from points on stdin, one per
//! line: a series name (spaces allowed), a size in bytes and a bandwidth
//! in GB/s, the last two last. One line per series, in order of first
//! appearance; `bench/compare --plot` draws its medians with it.
//!
//!   printf 'ccl 1024 2.5\nOpen MPI 1024 1.1\n' | ccl-plot --title "all_reduce" -o out.svg

use clap::Parser;
use std::io::Read;

#[derive(Parser, Debug)]
#[command(name = "ccl-plot", about = "Draws bandwidth against size (SERIES SIZE GBPS lines on stdin) as SVG")]
struct Args {
    /// The chart's title
    #[arg(long, default_value = "")]
    title: String,
    /// Where to write the SVG
    #[arg(short = 'o', long = "out")]
    out: std::path::PathBuf,
}

/// The series of `text`, or what is wrong with which line.
fn parse(text: &str) -> Result<Vec<ccl_examples::plot::Series>, String> {
    let mut series: Vec<ccl_examples::plot::Series> = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("line {}: expected SERIES SIZE GBPS, got {line:?}", i + 1);
        let [name @ .., size, gbps] = f.as_slice() else { return Err(bad()) };
        let (Ok(size), Ok(gbps)) = (size.parse::<usize>(), gbps.parse::<f64>()) else { return Err(bad()) };
        if name.is_empty() || !gbps.is_finite() {
            return Err(bad());
        }
        let name = name.join(" ");
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((size, gbps)),
            None => series.push(ccl_examples::plot::Series { name, points: vec![(size, gbps)] }),
        }
    }
    if series.is_empty() {
        return Err("no points on stdin".into());
    }
    for s in &mut series {
        s.points.sort_by_key(|p| p.0);
    }
    Ok(series)
}

fn main() {
    let a = Args::parse();
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("ccl-plot: stdin: {e}");
        std::process::exit(1);
    }
    let series = match parse(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ccl-plot: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::write(&a.out, ccl_examples::plot::svg(&a.title, &series)) {
        eprintln!("ccl-plot: {}: {e}", a.out.display());
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn names_with_spaces_in_order_of_first_appearance_sizes_sorted() {
        let s =
            parse("# medians\nccl 2048 3.5\nOpen MPI 1024 1.0\nccl 1024 2.0\n\nOpen MPI 2048 1.5\n").expect("parses");
        let names: Vec<&str> = s.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["ccl", "Open MPI"]);
        assert_eq!(s[0].points, [(1024, 2.0), (2048, 3.5)]);
        assert_eq!(s[1].points, [(1024, 1.0), (2048, 1.5)]);
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, line) in [("ccl 1024\n", 1), ("ccl 1024 2\n1024 2\n", 2), ("x y 2\n", 1), ("ccl 8 inf\n", 1)] {
            let e = parse(text).expect_err(text);
            assert!(e.starts_with(&format!("line {line}:")), "{text:?}: {e}");
        }
        assert_eq!(parse("# nothing\n").expect_err("empty"), "no points on stdin");
    }
}
