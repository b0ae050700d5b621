//! All-reduce benchmark with ranks as threads, nccl-tests style:
//! `bench_threads [ranks] [max bytes]` prints, per size, the time and the
//! algorithm and bus bandwidths (busbw = algbw × 2(n-1)/n), and checks the
//! result of every size (#wrong).

use ccl::testing::run_local;
use ccl::Sum;
use std::time::Instant;

fn main() -> ccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(4);
    let max: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(64 << 20);
    println!("# all_reduce f32 sum, {n} ranks as threads of one process");
    println!("# {:>12} {:>12} {:>10} {:>10} {:>10} {:>7}", "size(B)", "count", "time(us)", "algbw", "busbw", "#wrong");
    let rows = run_local(n, |g| -> ccl::Result<Vec<(usize, f64, usize)>> {
        let comm = g.typed::<f32>();
        let mut rows = Vec::new();
        let mut bytes = 8;
        while bytes <= max {
            let count = bytes / 4;
            let mut buf = vec![0f32; count];
            let iters = (200 * 1024 * 1024 / bytes.max(4096)).clamp(3, 200);
            for _ in 0..2 {
                comm.all_reduce(&mut buf, Sum)?; // warm up
            }
            let mut wrong = 0;
            g.barrier()?;
            let t = Instant::now();
            for it in 0..iters {
                buf.fill((g.rank() + it) as f32);
                comm.all_reduce(&mut buf, Sum)?;
                let want = (0..n).map(|r| (r + it) as f32).sum::<f32>();
                wrong += buf.iter().filter(|&&x| x != want).count();
            }
            rows.push((bytes, t.elapsed().as_secs_f64() / iters as f64, wrong));
            bytes *= 4;
        }
        Ok(rows)
    });
    let mut results = rows.into_iter();
    let first = results.next().unwrap_or(Ok(Vec::new()))?;
    let mut total_wrong = 0;
    for (i, &(bytes, secs, wrong)) in first.iter().enumerate() {
        let algbw = bytes as f64 / secs / 1e9;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        println!("  {:>12} {:>12} {:>10.1} {:>10.2} {:>10.2} {:>7}", bytes, bytes / 4, secs * 1e6, algbw, busbw, wrong);
        total_wrong += wrong;
        let _ = i;
    }
    for r in results {
        total_wrong += r?.iter().map(|x| x.2).sum::<usize>();
    }
    if total_wrong > 0 {
        eprintln!("{total_wrong} wrong elements");
        std::process::exit(1);
    }
    Ok(())
}
