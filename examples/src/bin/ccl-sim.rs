//! `ccl-sim`: predicted bus bandwidth of every algorithm on a modelled
//! cluster, from the same schedules ccl runs, and the tuner's pick.
//!
//! ```text
//! ccl-sim ccl/topologies/h100-8x8-ib.toml -b 1K -e 1G -f 4
//! ccl-sim ccl/topologies/namespaces-1gbit.toml -C all_gather --hosts 16
//! ```
//! A topology file gives hosts, ranks per host, and latency and bandwidth
//! inside a host, of each network link of a host (`nics` of them), and of
//! a rank's copies and reductions (see `ccl/topologies/`).

use ccl::algo::{Algo, Coll};
use ccl::sim::{Bucket, Call, Link, Model};
use ccl::topo::Hosts;
use ccl::tune::{auto_channels, estimated, pick_first, ranked_on_shared, simulated, simulated_on_shared};
use ccl_examples::{busbw_factor, parse_bytes};
use clap::Parser;
use serde::Deserialize;
use std::io::Write;
use std::path::PathBuf;

/// `write!` to the table's output; a closed pipe ends the program quietly.
macro_rules! out {
    ($o:expr, $($t:tt)*) => { write!($o, $($t)*).map_err(closed)? };
}
macro_rules! outln {
    ($o:expr) => { writeln!($o).map_err(closed)? };
    ($o:expr, $($t:tt)*) => { writeln!($o, $($t)*).map_err(closed)? };
}

/// An output error as a message, after ending the program if the reader
/// closed the pipe (as a program killed by SIGPIPE would end).
fn closed(e: std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    format!("writing the table: {e}")
}

#[derive(Parser, Debug)]
#[command(name = "ccl-sim", about = "Predicted busbw of every ccl algorithm on a modelled cluster")]
struct Args {
    /// Topology file (TOML)
    topology: PathBuf,
    /// Collective: all_reduce, all_gather, reduce_scatter, broadcast, reduce
    #[arg(short = 'C', long = "coll", default_value = "all_reduce")]
    coll: String,
    /// Smallest size in bytes (K, M, G suffixes); for all_gather and
    /// reduce_scatter of the whole vector, as nccl-tests counts it
    #[arg(short = 'b', long = "minbytes", default_value = "8")]
    min: String,
    /// Largest size in bytes
    #[arg(short = 'e', long = "maxbytes", default_value = "256M")]
    max: String,
    /// Multiply the size by this much each step
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    factor: usize,
    /// Bytes per element
    #[arg(long = "elem", default_value_t = 4)]
    elem: usize,
    /// Channels, or `auto`: each algorithm on as many as the tuner would
    /// take for it (across hosts, or on GPUs, the fewest of 1, 2, 4, 8, 16
    /// within 10 % of the fastest by the closed form; else one)
    #[arg(long, default_value = "auto", value_parser = channels)]
    channels: Width,
    /// Bytes per pipeline piece (default: as ccl's tuner cuts them, half a
    /// connection's slots)
    #[arg(long)]
    chunk: Option<String>,
    /// Bytes per slot (default: as ccl cuts and fills them on these hosts:
    /// 64K within a host whose ranks each have a core, of which calls of
    /// 4 MiB and more fill 32K, else 32K; 512K where every link is TCP)
    #[arg(long)]
    slot: Option<String>,
    /// Override the file's host count
    #[arg(long)]
    hosts: Option<usize>,
    /// Override the file's ranks per host
    #[arg(long)]
    ranks_per_host: Option<usize>,
    /// Also draw predicted busbw against size, one line per algorithm, as SVG to this file
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print each algorithm's predicted time per call (us) instead of its busbw
    #[arg(long)]
    times: bool,
    /// Time in-place calls, where a rank reduces into the memory it reads
    /// (default: separate input and output, as the tuner times them); the
    /// pick is still the tuner's, from the out-of-place times
    #[arg(long)]
    in_place: bool,
    /// Buffers from `alloc_shared` on every rank: the tuner also weighs
    /// algorithm `direct` (each rank reading and writing its peers'
    /// buffers), timed in place or not as asked, and the others out of
    /// place, as the tuner times them
    #[arg(long)]
    shared: bool,
    /// Predict with the closed-form cost model, which the tuner uses,
    /// instead of the simulator
    #[arg(long)]
    closed: bool,
    /// Print, per algorithm, the closed form's time over the simulator's,
    /// and whether the two pick the same algorithm; where they are more
    /// than 10 % apart, the model's terms that, taken away from both,
    /// bring them within 10 %
    #[arg(long)]
    compare: bool,
}

/// `[intra]`: between ranks of one host. Unknown keys are errors, so a
/// misspelt or misplaced one is not silently left out of the model.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IntraSpec {
    latency_us: f64,
    bandwidth_gb_s: f64,
    /// GB/s of fetching a message's first slot, on top of
    /// `bandwidth_gb_s` (absent: not modelled).
    #[serde(default)]
    first_slot_gb_s: f64,
    /// KiB of a message's first slot that come at `first_slot_gb_s`, at
    /// most (absent: the whole slot).
    #[serde(default)]
    first_slot_kib: f64,
}

/// `[inter]`: each of a host's network links.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InterSpec {
    latency_us: f64,
    bandwidth_gb_s: f64,
    #[serde(default = "one")]
    nics: usize,
    /// KiB of a token bucket shaping each link, as tc tbf's burst (absent:
    /// a plain link); `bandwidth_gb_s` is then its rate.
    #[serde(default)]
    burst_kib: f64,
    /// GB/s of a shaped link while its bucket has tokens: the link's own
    /// speed (needed with `burst_kib`).
    #[serde(default)]
    peak_gb_s: f64,
}

fn one() -> usize {
    1
}

/// Predicted seconds per algorithm, the pick first.
type Times = Vec<(Algo, f64)>;

/// `--channels`: as the tuner would take them, or so many.
#[derive(Clone, Copy, Debug)]
enum Width {
    Auto,
    Of(usize),
}

fn channels(s: &str) -> Result<Width, String> {
    match s {
        "auto" => Ok(Width::Auto),
        _ => match s.parse::<usize>() {
            Ok(c) if c > 0 => Ok(Width::Of(c)),
            _ => Err(format!("{s:?}: expected a channel count from 1, or auto")),
        },
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RankSpec {
    copy_gb_s: f64,
    reduce_gb_s: f64,
    step_us: f64,
    /// Microseconds of fixed work per call (absent: none).
    #[serde(default)]
    call_us: f64,
    /// Cores per host; ranks beyond them share (0 or absent: enough).
    #[serde(default)]
    cores: usize,
    /// Microseconds of core time a rank spends getting a core back to take
    /// a message on a host with more ranks than cores (scaled by the share
    /// without one); its other channels wait behind it.
    #[serde(default)]
    switch_us: f64,
    /// Cache per host in MiB (absent: not modelled).
    #[serde(default)]
    cache_mib: f64,
    /// Speed-up of copies and reductions on data that fits the cache.
    #[serde(default = "unit")]
    cached_speedup: f64,
    /// The same where ranks share cores (absent: none).
    #[serde(default = "unit")]
    shared_cached_speedup: f64,
    /// What the ranks are: `cpu` (absent), one progress thread each, or
    /// `gpu`, each channel on a stream of its own.
    #[serde(default)]
    device: Device,
}

fn unit() -> f64 {
    1.0
}

#[derive(Deserialize, Default, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Device {
    #[default]
    Cpu,
    Gpu,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Topology {
    name: String,
    hosts: usize,
    ranks_per_host: usize,
    intra: IntraSpec,
    inter: InterSpec,
    rank: RankSpec,
}

fn link(latency_us: f64, bandwidth_gb_s: f64) -> Link {
    Link { latency: latency_us * 1e-6, bandwidth: bandwidth_gb_s * 1e9 }
}

fn bucket(inter: &InterSpec) -> Result<Option<Bucket>, String> {
    match (inter.burst_kib, inter.peak_gb_s) {
        (0.0, _) => Ok(None),
        (b, p) if b > 0.0 && p > 0.0 => Ok(Some(Bucket { peak: p * 1e9, burst: b * 1024.0 })),
        (b, p) => Err(format!(
            "[inter]: a token bucket needs burst_kib > 0 and peak_gb_s > 0 (got burst_kib = {b}, peak_gb_s = {p})"
        )),
    }
}

fn run(a: &Args) -> Result<(), String> {
    let text = std::fs::read_to_string(&a.topology).map_err(|e| format!("{}: {e}", a.topology.display()))?;
    let t: Topology = toml::from_str(&text).map_err(|e| format!("{}: {e}", a.topology.display()))?;
    let (nh, per) = (a.hosts.unwrap_or(t.hosts), a.ranks_per_host.unwrap_or(t.ranks_per_host));
    if nh == 0 || per == 0 || nh * per > 1 << 16 {
        return Err(format!("{nh} hosts × {per} ranks: expected 1 ..= 65536 ranks"));
    }
    let nics = t.inter.nics;
    if nics == 0 || !per.is_multiple_of(nics) {
        // each rank crosses through NIC `local rank % nics`: a count that
        // does not divide the ranks would load some NICs more than others
        let line = text.lines().position(|l| l.trim_start().starts_with("nics")).map_or(0, |i| i + 1);
        return Err(format!(
            "{}:{line}: [inter] nics = {nics} does not divide the {per} ranks of a host (expected a divisor of {per})",
            a.topology.display()
        ));
    }
    let coll = Coll::ALL
        .into_iter()
        .find(|c| c.name() == a.coll.replace('-', "_") && !matches!(c, Coll::Send | Coll::Recv | Coll::Barrier))
        .ok_or_else(|| format!("unknown collective {:?}", a.coll))?;
    let model = Model {
        intra: link(t.intra.latency_us, t.intra.bandwidth_gb_s),
        first_slot: t.intra.first_slot_gb_s * 1e9,
        first_max: (t.intra.first_slot_kib * 1024.0) as usize,
        inter: link(t.inter.latency_us, t.inter.bandwidth_gb_s),
        nics,
        bucket: bucket(&t.inter).map_err(|e| format!("{}: {e}", a.topology.display()))?,
        copy: t.rank.copy_gb_s * 1e9,
        reduce: t.rank.reduce_gb_s * 1e9,
        step: t.rank.step_us * 1e-6,
        call: t.rank.call_us * 1e-6,
        cores: t.rank.cores,
        switch: t.rank.switch_us * 1e-6,
        cache: t.rank.cache_mib * (1 << 20) as f64,
        cached: t.rank.cached_speedup,
        shared_cached: t.rank.shared_cached_speedup,
        streams: t.rank.device == Device::Gpu,
    };
    model.check().map_err(|e| format!("{}: {e}", a.topology.display()))?;
    let hosts = Hosts::blocks(&vec![per; nh]);
    let n = nh * per;
    let elem = a.elem.max(1);
    // slots as the ranks of one of these hosts would cut them (0 cores: enough)
    let cpus = if t.rank.cores == 0 { per } else { t.rank.cores };
    let ring =
        ccl::Config::default().on_machine(&ccl::machine::Machine { ranks: per, cpus, llc: None }).slots_on(&hosts);
    let slot_set = a.slot.as_deref().map(parse_bytes).transpose()?;
    let chunk_set = a.chunk.as_deref().map(parse_bytes).transpose()?;
    // a reader that goes away (`ccl-sim ... | head`) ends the program quietly
    let mut o = std::io::stdout().lock();
    let mut algos = coll.algos().to_vec();
    if a.shared && coll.on_shared(a.in_place) {
        algos.insert(0, Algo::Direct);
    }
    outln!(
        o,
        "# ccl-sim: {coll} on {n} ranks ({nh} hosts x {per}), {elem}-byte elements, {}, {}",
        t.name,
        format!(
            "{}{}",
            if a.in_place { "in place" } else { "out of place" },
            if a.shared { ", shared buffers" } else { "" }
        )
    );
    outln!(
        o,
        "#   inside a host {}; network {} x {}{}; rank copy {:.0} GB/s, reduce {:.0} GB/s",
        model.intra,
        model.nics,
        model.inter,
        model.bucket.map_or(String::new(), |b| format!(
            " (token bucket of {:.0} KiB, {:.2} GB/s while it lasts)",
            b.burst / 1024.0,
            b.peak / 1e9
        )),
        model.copy / 1e9,
        model.reduce / 1e9
    );
    outln!(
        o,
        "# predicted {} per algorithm by {} (skip: over {} steps, not considered); pick: the fastest (from the \
         out-of-place times, in place too, ties as the tuner breaks them), its time and its channels",
        if a.times { "time per call (us)" } else { "busbw (GB/s)" },
        if a.compare {
            "the closed form over the simulator (time ratio)"
        } else if a.closed {
            "the closed-form model, as the tuner prices them"
        } else {
            "the simulator"
        },
        ccl::sim::MAX_STEPS
    );
    out!(o, "# {:>12} {:>12}", "size (B)", "count");
    for al in &algos {
        out!(o, " {:>10}", al.name());
    }
    outln!(o, " {:>10} {:>12} {:>8}", "pick", "time (us)", "channels");
    // sizes as nccl-tests and ccl-perf give them: of the whole gathered or
    // scattered vector, n times what each rank gives or keeps
    let unit = elem * if matches!(coll, Coll::AllGather | Coll::ReduceScatter) { n } else { 1 };
    let (mut size, max) = (parse_bytes(&a.min)?.max(unit), parse_bytes(&a.max)?);
    let started = std::time::Instant::now();
    let (mut compared, mut picks, mut apart) = (Vec::new(), Vec::new(), Vec::new());
    let mut lines: Vec<ccl_examples::plot::Series> =
        algos.iter().map(|al| ccl_examples::plot::Series { name: al.name().into(), points: Vec::new() }).collect();
    while size <= max {
        let count = size / unit;
        let bytes = count * unit;
        // slots filled and pieces cut as ccl's tuner would for this size,
        // or as asked (pieces of half a connection's slots of that size)
        let (slot, chunk) = match slot_set {
            None => ccl::tune::cut(elem, ring),
            Some(s) => ccl::tune::pieces(s, elem, ring),
        };
        let chunk = chunk_set.map_or(chunk, |c| (c / elem).max(1));
        let call = Call { coll, count, elem, root: 0, channels: 1, chunk, slot, in_place: a.in_place };
        // each algorithm on its channels (on shared buffers, all on the
        // collective's)
        let width = |algos: &[Algo]| match a.channels {
            Width::Of(c) => c,
            Width::Auto => auto_channels(&call, algos, &hosts, &model),
        };
        let on = |al: Algo| Call { channels: width(&[al]), ..call };
        let each = |time: &dyn Fn(&Call, &[Algo]) -> Times| {
            let mut t: Vec<_> = algos.iter().flat_map(|&al| time(&on(al), &[al])).collect();
            pick_first(&algos, &mut t);
            t
        };
        let shared = Call { channels: width(coll.algos()), ..call };
        let channels_of = |al: Algo| if a.shared { shared.channels } else { on(al).channels };
        let times = if a.shared && a.closed {
            ranked_on_shared(&shared, a.in_place, &hosts, &model)
        } else if a.closed || a.compare {
            each(&|c, al| estimated(c, al, &hosts, &model))
        } else if a.shared {
            simulated_on_shared(&shared, a.in_place, &hosts, &model)
        } else {
            each(&|c, al| simulated(c, al, &hosts, &model))
        };
        if a.compare {
            let sim = each(&|c, al| simulated(c, al, &hosts, &model));
            out!(o, "  {bytes:>12} {count:>12}");
            for al in &algos {
                let c = times.iter().find(|t| t.0 == *al).map(|t| t.1);
                match (c, sim.iter().find(|t| t.0 == *al).map(|t| t.1)) {
                    (Some(c), Some(s)) => {
                        let r = c / s;
                        compared.push(r);
                        if !(0.9..=1.1).contains(&r) {
                            // the model's terms the two price differently
                            let terms = ccl::tune::terms_apart(&call, *al, &hosts, &model);
                            let why = if terms.is_empty() { "no one term".into() } else { terms.join(", ") };
                            apart.push(format!("{bytes} B, {}: {r:.2}; within 10 % without: {why}", al.name()));
                        }
                        out!(o, " {r:>10.2}")
                    }
                    _ => out!(o, " {:>10}", "-"),
                }
            }
            let same = times.first().map(|t| t.0) == sim.first().map(|t| t.0);
            picks.push(same);
            outln!(
                o,
                " {:>10} {:>12}",
                times.first().map_or("-", |t| t.0.name()),
                if same { "same" } else { "DIFFERS" }
            );
            if a.factor < 2 {
                break;
            }
            size = size.saturating_mul(a.factor);
            continue;
        }
        out!(o, "  {bytes:>12} {count:>12}");
        for (al, line) in algos.iter().zip(&mut lines) {
            match times.iter().find(|(x, _)| x == al) {
                Some((_, secs)) => {
                    let busbw = bytes as f64 / secs / 1e9 * busbw_factor(coll.name(), n);
                    line.points.push((bytes, busbw));
                    if a.times {
                        out!(o, " {:>10.2}", secs * 1e6)
                    } else {
                        out!(o, " {busbw:>10.2}")
                    }
                }
                None => out!(o, " {:>10}", "skip"),
            }
        }
        // the tuner times calls out of place, and keeps its choice for in-place ones
        let chosen = if a.in_place && !a.shared {
            let out = |c: &Call| Call { in_place: false, ..*c };
            let t = match a.closed {
                true => each(&|c, al| estimated(&out(c), al, &hosts, &model)),
                false => each(&|c, al| simulated(&out(c), al, &hosts, &model)),
            };
            t.first().map(|t| t.0)
        } else {
            times.first().map(|t| t.0)
        };
        match chosen.and_then(|c| times.iter().find(|t| t.0 == c)) {
            Some(&(pick, secs)) => outln!(o, " {:>10} {:>12.1} {:>8}", pick.name(), secs * 1e6, channels_of(pick)),
            None => outln!(o),
        }
        if a.factor < 2 {
            break;
        }
        size = size.saturating_mul(a.factor);
    }
    if a.compare {
        let within = compared.iter().filter(|r| (0.9..=1.1).contains(*r)).count();
        let same = picks.iter().filter(|&&s| s).count();
        outln!(
            o,
            "# closed / simulated: {within} of {} within 10 %; the same pick at {same} of {} sizes",
            compared.len(),
            picks.len()
        );
        for miss in &apart {
            outln!(o, "# beyond 10 %: {miss}");
        }
    }
    outln!(o, "# predicted in {:.3} s", started.elapsed().as_secs_f64());
    if let Some(path) = &a.plot {
        let title = format!("ccl-sim: {coll} on {n} ranks, {}", t.name);
        std::fs::write(path, ccl_examples::plot::svg(&title, &lines))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(&a) {
        eprintln!("ccl-sim: {e}");
        std::process::exit(2);
    }
}
