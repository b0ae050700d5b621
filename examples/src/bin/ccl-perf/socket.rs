//! `--backend socket`: raw TCP between ranks 0 and 1 (started by cclrun
//! like any ccl-perf run), the yardstick for ccl's TCP transport. Per size,
//! both ranks write the bytes on one plain socket and read the other's at
//! once (a writer thread each), which is what a 2-rank all-reduce of that
//! size puts on the wire: each rank sends and receives that many bytes.
//! algbw is size / time, as for the all-reduce. The listener's port travels
//! through a ccl broadcast; nothing else uses ccl.

use super::table::{self, Mode};
use super::Args;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

fn io(e: std::io::Error) -> ccl::Error {
    ccl::Error::new(ccl::ErrorKind::Transport(format!("raw socket: {e}")))
}

/// Runs the sweep on `g`'s ranks 0 and 1 (others wait).
pub fn run(g: &ccl::Group, a: &Args) -> ccl::Result<()> {
    if g.size() < 2 {
        return Err(ccl::Error::new(ccl::ErrorKind::InvalidArgument("--backend socket needs 2 ranks".into())));
    }
    let me = g.rank();
    let listener = if me == 1 { Some(TcpListener::bind("127.0.0.1:0").map_err(io)?) } else { None };
    let mut port = [listener.as_ref().and_then(|l| l.local_addr().ok()).map_or(0, |a| u64::from(a.port()))];
    g.typed::<u64>().broadcast(&mut port, 1)?;
    let mut sock = match (me, &listener) {
        (0, _) => Some(TcpStream::connect(("127.0.0.1", port[0] as u16)).map_err(io)?),
        (1, Some(l)) => Some(l.accept().map_err(io)?.0),
        _ => None,
    };
    if let Some(s) = &sock {
        s.set_nodelay(true).map_err(io)?;
    }
    if me == 0 {
        println!(
            "# ccl-perf: raw TCP between ranks 0 and 1 (one socket, loopback), {} iters, {} warmup",
            a.iters, a.warmup
        );
    }
    let mut table = table::Table::new(me == 0, "raw_tcp", 2, false);
    let mut size = a.min.max(1);
    while size <= a.max.max(1) {
        let out = vec![1u8; size];
        let mut buf = vec![0u8; size];
        let mut once = |s: &mut TcpStream| -> std::io::Result<()> {
            if size <= 64 << 10 {
                // fits the socket buffers: write, then read, no thread needed
                s.write_all(&out)?;
                return s.read_exact(&mut buf);
            }
            let mut w = s.try_clone()?;
            std::thread::scope(|sc| {
                let writer = sc.spawn(|| w.write_all(&out));
                let r = s.read_exact(&mut buf);
                writer.join().unwrap_or_else(|_| Err(std::io::Error::other("writer panicked"))).and(r)
            })
        };
        let mut secs = 0.0;
        if let Some(s) = sock.as_mut() {
            for _ in 0..a.warmup {
                once(s).map_err(io)?;
            }
            let t = Instant::now();
            for _ in 0..a.iters.max(1) {
                once(s).map_err(io)?;
            }
            secs = t.elapsed().as_secs_f64() / a.iters.max(1) as f64;
        }
        let algbw = size as f64 / secs / 1e9;
        let m = || Mode { time_us: secs * 1e6, algbw, busbw: algbw, wrong: 0, host_us: None };
        table.row(size, size, "byte", "none", -1, &m(), &m());
        if a.factor < 2 {
            break;
        }
        size = size.saturating_mul(a.factor);
    }
    if let Err(code) =
        table.save(a.plot.as_deref(), a.json.as_deref(), "ccl-perf --backend socket (loopback)", "raw TCP")
    {
        std::process::exit(code);
    }
    g.barrier()
}
