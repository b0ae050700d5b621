//! Every example binary runs and succeeds as a lone process (a world of
//! one); integration/tests/examples.rs runs them through cclrun at np 2..4.

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).env_remove("CCL_RANK").output().expect("start example");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{bin} failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn bench_threads_checks_every_size() {
    let out = run(env!("CARGO_BIN_EXE_bench_threads"), &["3", "65536"]);
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 7, "8 B to 64 KiB by 4x: {out}");
    assert!(rows.iter().all(|r| r.trim_end().ends_with(" 0")), "no wrong elements: {out}");
}

#[test]
fn lone_examples() {
    assert!(run(env!("CARGO_BIN_EXE_hello"), &[]).contains("rank 0 of 1"));
    run(env!("CARGO_BIN_EXE_custom_op"), &[]);
    assert!(run(env!("CARGO_BIN_EXE_train_step"), &[]).contains("identical on all 1 ranks: true"));
    let svg = std::env::temp_dir().join(format!("ccl-perf-{}.svg", std::process::id()));
    let svg_arg = svg.to_string_lossy().into_owned();
    let perf = run(
        env!("CARGO_BIN_EXE_ccl-perf"),
        &["-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "--plot", &svg_arg],
    );
    assert!(perf.contains("# Out of bounds values : 0 OK"), "{perf}");
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(text.contains("ccl out_of_place") && text.contains("ccl in_place"), "{text}");
    let _ = std::fs::remove_file(svg);
}

#[test]
fn ccl_plot_draws_one_line_per_series_from_stdin() {
    use std::io::Write;
    let svg = std::env::temp_dir().join(format!("ccl-plot-{}.svg", std::process::id()));
    let draw = |text: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ccl-plot"))
            .args(["--title", "compare", "-o"])
            .arg(&svg)
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("ccl-plot");
        c.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
        c.wait_with_output().expect("ccl-plot")
    };
    let o = draw("ccl 8 0.1\nOpen MPI 8 0.05\nccl 1024 2.5\nOpen MPI 1024 1.2\n");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(text.contains(">ccl<") && text.contains(">Open MPI<") && text.contains("compare"), "{text}");
    let _ = std::fs::remove_file(&svg);
    let o = draw("ccl 8\n");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 1: expected SERIES SIZE GBPS"));
    assert!(!svg.exists(), "nothing written for bad input");
}

#[test]
fn ccl_sim_simulates_every_algorithm_at_4096_ranks_and_refuses_a_zero_rate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ccl/topologies");
    let topo = dir.join("h100-8x8-ib.toml").to_string_lossy().into_owned();
    let args = [&*topo, "--hosts", "512", "-b", "8", "-e", "1G", "-f", "8", "--channels", "1"];
    let out = run(env!("CARGO_BIN_EXE_ccl-sim"), &args);
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 10, "{out}");
    assert!(!rows.iter().any(|r| r.contains("skip")), "every algorithm at every size: {out}");
    assert!(out.contains("by the simulator"), "{out}");
    // a large call keeps every link of a host busy: the hierarchical ring
    assert_eq!(rows[9].split_whitespace().rev().nth(2), Some("ring-ring"), "{out}");
    // the closed form, and the two side by side
    let closed =
        run(env!("CARGO_BIN_EXE_ccl-sim"), &[&topo, "--hosts", "512", "-b", "8", "-e", "1G", "-f", "8", "--closed"]);
    assert!(closed.contains("by the closed-form model"), "{closed}");
    assert!(!closed.lines().any(|l| !l.starts_with('#') && l.contains("skip")), "{closed}");
    let compared = run(env!("CARGO_BIN_EXE_ccl-sim"), &[&topo, "--hosts", "512", "-b", "1M", "-e", "1M", "--compare"]);
    assert!(compared.contains("closed / simulated: "), "{compared}");
    // all-gather sizes are of the whole vector, as nccl-tests gives them:
    // below one element a rank, none
    let gather =
        run(env!("CARGO_BIN_EXE_ccl-sim"), &[&topo, "--hosts", "512", "-C", "all_gather", "-b", "8", "-e", "16K"]);
    let rows: Vec<&str> = gather.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 1, "{gather}");
    assert!(rows[0].split_whitespace().take(2).eq(["16384", "1"]), "{gather}");
    // a rate that is not above 0 is an error naming its key
    let h100 = std::fs::read_to_string(&topo).expect("h100 topology");
    let wrong = std::env::temp_dir().join(format!("ccl-sim-zero-{}.toml", std::process::id()));
    std::fs::write(&wrong, h100.replacen("copy_gb_s = 2500.0", "copy_gb_s = 0.0", 1)).expect("write topology");
    let out = Command::new(env!("CARGO_BIN_EXE_ccl-sim")).arg(&wrong).output().expect("ccl-sim");
    let _ = std::fs::remove_file(&wrong);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("[rank] copy_gb_s = 0: must be above 0"), "{err}");
    // NICs that do not divide a host's ranks: an error naming the line
    let out =
        Command::new(env!("CARGO_BIN_EXE_ccl-sim")).args([&*topo, "--ranks-per-host", "6"]).output().expect("ccl-sim");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("h100-8x8-ib.toml:14: [inter] nics = 8 does not divide the 6 ranks of a host"), "{err}");
}

/// `N of M` pairs in a `ccl-sim --compare` summary line: times within 10 %
/// and the same picks.
fn compared(line: &str) -> Option<[(usize, usize); 2]> {
    let nums: Vec<usize> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    match nums[..] {
        [w, t, _ten, s, z] => Some([(w, t), (s, z)]),
        _ => None,
    }
}

/// `ccl-sim --compare` over every shipped topology and collective, 8 B -
/// 1 GiB by 8x, on `channels` channels: times within 10 %, times, same
/// picks, sizes; and the lines that miss.
fn compare_shipped(channels: &str) -> ([usize; 4], Vec<String>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ccl/topologies");
    let mut sums = [0; 4];
    let mut misses = Vec::new();
    for f in std::fs::read_dir(&dir).expect("topologies").flatten() {
        let path = f.path().to_string_lossy().into_owned();
        for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"] {
            let args = [&path, "-C", coll, "--channels", channels, "--compare", "-b", "8", "-e", "1G", "-f", "8"];
            let out = run(env!("CARGO_BIN_EXE_ccl-sim"), &args);
            let line = out.lines().find(|l| l.contains("within 10 %")).unwrap_or_else(|| panic!("{out}"));
            let [(w, t), (s, z)] = compared(line).unwrap_or_else(|| panic!("{line}"));
            if w < t || s < z {
                misses.push(format!("{path} {coll}: {line}"));
                // each point more than 10 % apart, with the terms priced differently
                let apart = out.lines().filter(|l| l.starts_with("# beyond 10 %"));
                misses.extend(apart.map(|l| format!("  {l}")));
            }
            for (sum, v) in sums.iter_mut().zip([w, t, s, z]) {
                *sum += v;
            }
        }
    }
    let [within, points, same, sizes] = sums;
    eprintln!(
        "{channels} channel(s): {within} of {points} within 10 %, {same} of {sizes} picks\n{}",
        misses.join("\n")
    );
    (sums, misses)
}

#[test]
fn the_closed_form_follows_the_simulator_on_every_shipped_topology() {
    // one channel: the times within 10 % at 98 % of the points and the
    // same pick at every size (issue 34's bar: 95 %)
    let ([within, points, same, sizes], misses) = compare_shipped("1");
    assert!(points >= 500 && within * 100 >= points * 98, "{within} of {points}: {misses:#?}");
    assert_eq!(same, sizes, "{misses:#?}");
    // two channels: the same picks, the times within 10 % at 90 %
    let ([within, points, same, sizes], misses) = compare_shipped("2");
    assert!(points >= 500 && within * 100 >= points * 90, "{within} of {points}: {misses:#?}");
    assert_eq!(same, sizes, "{misses:#?}");
}

#[test]
fn ccl_sim_times_each_algorithm_on_the_channels_the_tuner_would_take() {
    // 8 hosts of 8 H100: a 1 GiB all-reduce on 8 channels or more, one
    // ring per channel crossing through a NIC of its own; an 8 B one on one
    let topo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ccl/topologies/h100-8x8-ib.toml");
    let topo = topo.to_string_lossy();
    for closed in [false, true] {
        let mut args = vec![&*topo, "-b", "8", "-e", "1G", "-f", "134217728"];
        if closed {
            args.push("--closed");
        }
        let out = run(env!("CARGO_BIN_EXE_ccl-sim"), &args);
        let rows: Vec<Vec<&str>> =
            out.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows.len(), 2, "{out}");
        let (small, large) = (&rows[0], &rows[1]);
        assert_eq!(small[small.len() - 1], "1", "{out}");
        assert_eq!(large[large.len() - 3], "ring", "{out}");
        let channels: usize = large[large.len() - 1].parse().expect("channels");
        assert!(channels >= 8, "{out}");
        let ring: f64 = large[2].parse().expect("ring's busbw");
        assert!(ring >= 360.0, "{out}");
    }
    for bad in ["0", "many"] {
        let out =
            Command::new(env!("CARGO_BIN_EXE_ccl-sim")).args([&*topo, "--channels", bad]).output().expect("ccl-sim");
        assert_eq!(out.status.code(), Some(2), "--channels {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("expected a channel count from 1, or auto"));
    }
}

#[test]
fn ccl_sim_reads_every_shipped_topology() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ccl/topologies");
    let mut seen = 0;
    for f in std::fs::read_dir(&dir).expect("topologies").flatten() {
        let path = f.path().to_string_lossy().into_owned();
        let out = run(env!("CARGO_BIN_EXE_ccl-sim"), &[&path, "-b", "8", "-e", "64M", "-f", "64"]);
        let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 4, "{path}: 8 B .. 2 MiB by 64x: {out}");
        // every row names the pick, one of the algorithms of the header
        for r in rows {
            let pick = r.split_whitespace().rev().nth(2).unwrap_or("");
            assert!(["ring", "tree", "rd", "rhd", "ring-ring", "tree-ring"].contains(&pick), "{r}");
        }
        seen += 1;
    }
    assert!(seen >= 4, "{seen} topology files");
    // --plot draws one line per algorithm
    let svg = std::env::temp_dir().join(format!("ccl-sim-{}.svg", std::process::id()));
    let topo = dir.join("namespaces-1gbit.toml").to_string_lossy().into_owned();
    run(env!("CARGO_BIN_EXE_ccl-sim"), &[&topo, "-b", "8", "-e", "1M", "--plot", &svg.to_string_lossy()]);
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert_eq!(text.matches("stroke-width=\"2\" fill=\"none\"").count(), 6, "{text}");
    let _ = std::fs::remove_file(svg);
    let bad = Command::new(env!("CARGO_BIN_EXE_ccl-sim")).args(["/no/such.toml"]).output().expect("ccl-sim");
    assert_eq!(bad.status.code(), Some(2));
    // a key where it means nothing (the first-slot fetch is inside a host)
    // or misspelt is an error naming it, not a figure silently left out
    let shm = std::fs::read_to_string(dir.join("this-machine-shm.toml")).expect("shm topology");
    for (from, to) in [("first_slot_gb_s", "first_slot_gbs"), ("[inter]\n", "[inter]\nfirst_slot_gb_s = 30.0\n")] {
        let wrong = std::env::temp_dir().join(format!("ccl-sim-bad-{}.toml", std::process::id()));
        std::fs::write(&wrong, shm.replacen(from, to, 1)).expect("write topology");
        let out = Command::new(env!("CARGO_BIN_EXE_ccl-sim")).arg(&wrong).output().expect("ccl-sim");
        let _ = std::fs::remove_file(&wrong);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{to}: {err}");
        assert!(err.contains("unknown field"), "{to}: {err}");
    }
    // a token bucket without the speed it sends at while it lasts
    let ns = std::fs::read_to_string(&topo).expect("namespace topology");
    assert!(ns.contains("peak_gb_s"), "the namespace hosts' links are shaped by a bucket");
    let wrong = std::env::temp_dir().join(format!("ccl-sim-nopeak-{}.toml", std::process::id()));
    let lines: Vec<&str> = ns.lines().filter(|l| !l.starts_with("peak_gb_s")).collect();
    std::fs::write(&wrong, lines.join("\n")).expect("write topology");
    let out = Command::new(env!("CARGO_BIN_EXE_ccl-sim")).arg(&wrong).output().expect("ccl-sim");
    let _ = std::fs::remove_file(&wrong);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("peak_gb_s"), "{err}");
}

#[test]
fn ccl_sim_ends_quietly_when_its_reader_goes_away_and_reports_other_write_errors() {
    use std::process::Stdio;
    let topo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ccl/topologies/this-machine-shm.toml");
    let topo = topo.to_string_lossy().into_owned();
    // `ccl-sim ... | head -0`: the reader has gone before the first line
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccl-sim"))
        .arg(&topo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ccl-sim");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("ccl-sim ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.is_empty(), "{:?}: {err}", out.status);
    // a full disk is an error with a message
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_ccl-sim")).arg(&topo).stdout(full).output().expect("ccl-sim");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("writing the table"));
}

#[test]
fn the_tuners_default_model_is_the_shipped_model_of_this_machine() {
    // Model::DEFAULT and ccl/topologies/this-machine-shm.toml carry the same
    // fitted figures: ccl-sim's closed-form picks and times for the file
    // (out of place and in place) are the tuner's for the default model on
    // 2 cores, with 2 ranks and with 4 sharing them
    use ccl::algo::Coll;
    use ccl::sim::{Call, Model};
    use ccl::topo::Hosts;
    let topo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ccl/topologies/this-machine-shm.toml");
    let model = Model::DEFAULT.with_cores(2);
    for (ranks, in_place) in [(2, false), (2, true), (4, false), (4, true)] {
        // slots and pieces as ccl cuts them for these ranks on 2 cores
        let hosts = Hosts::blocks(&[ranks]);
        let ring =
            ccl::Config::default().on_machine(&ccl::machine::Machine { ranks, cpus: 2, llc: None }).slots_on(&hosts);
        let (topo, ranks_arg) = (topo.to_string_lossy(), ranks.to_string());
        let mut args =
            vec![&*topo, "--ranks-per-host", &ranks_arg, "-b", "8", "-e", "64M", "-f", "8", "--times", "--closed"];
        if in_place {
            args.push("--in-place");
        }
        let out = run(env!("CARGO_BIN_EXE_ccl-sim"), &args);
        let mut rows = 0;
        for row in out.lines().filter(|l| !l.starts_with('#')) {
            let w: Vec<&str> = row.split_whitespace().collect();
            let count: usize = w[1].parse().expect("count");
            let (slot, chunk) = ccl::tune::cut(4, ring);
            let (pick, us): (&str, f64) = (w[w.len() - 3], w[w.len() - 2].parse().expect("time"));
            assert_eq!(w[w.len() - 1], "1", "one host of CPUs: one channel: {row}");
            // the tuner's choice, and its time as asked
            let call = Call { coll: Coll::AllReduce, count, elem: 4, root: 0, channels: 1, chunk, slot, in_place };
            let (algo, _) = ccl::tune::ranked(&call, &hosts, &model)[0];
            let ours = ccl::tune::predictions(&call, &hosts, &model);
            let &(_, secs) = ours.iter().find(|t| t.0 == algo).expect("the chosen one timed");
            assert_eq!(pick, algo.name(), "{ranks} ranks, in place {in_place}: {row}");
            assert!(
                (secs * 1e6 - us).abs() <= 0.05 + 1e-3 * us,
                "{ranks} ranks, in place {in_place}: {row}: the default model says {:.1} us",
                secs * 1e6
            );
            rows += 1;
        }
        assert_eq!(rows, 8, "8 B .. 16 MiB by 8x: {out}");
    }
}

#[test]
fn core_latency_times_a_round_trip_and_refuses_bad_cpus() {
    let bin = env!("CARGO_BIN_EXE_core-latency");
    let two = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    if two {
        let out = run(bin, &["--rounds", "2000", "--samples", "3"]);
        let ns: f64 = out.trim().parse().expect("one number");
        assert!(ns > 0.0, "{out}");
    }
    // 1024: past the last CPU a cpu_set_t holds
    for args in [&["--cpus", "1,1"][..], &["--cpus", "0"], &["--cpus", "0,1024"], &["--rounds", "0"]] {
        let out = Command::new(bin).args(args).output().expect("core-latency");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("core-latency: "), "{args:?}: {err}");
    }
}
