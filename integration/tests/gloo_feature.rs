//! With cargo feature `gloo`: `ccl-perf --backend gloo` (scripts/test.sh
//! builds ccl-perf with feature `gloo`, against Debian's libgloo-dev,
//! before this test) runs Gloo's all-reduce algorithms under cclrun and
//! checks their results in the same table as ccl's. Run with
//! `cargo test -p ccl-integration --features gloo --test gloo_feature`.
#![cfg(feature = "gloo")]

use std::process::{Command, Output};

fn perf(np: usize, args: &[&str]) -> Output {
    let cclrun = ccl_integration::cclrun();
    Command::new(&cclrun)
        .args(["-np", &np.to_string()])
        .arg(cclrun.with_file_name("ccl-perf"))
        .args(["--backend", "gloo"])
        .args(args)
        .output()
        .expect("cclrun")
}

#[test]
fn gloo_all_reduce_through_cclrun_is_checked() {
    // bcube needs a power of 2 ranks
    for (np, algos) in [(2, &["ring_chunked", "halving_doubling", "ring", "bcube"][..]), (3, &["ring_chunked", "ring"])]
    {
        for algo in algos {
            let o = perf(np, &["--algo", algo, "-b", "8", "-e", "256K", "-f", "8", "-n", "2", "-w", "1"]);
            let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            assert!(o.status.success(), "{algo} at np {np}: {out}{err}");
            assert!(
                out.contains(&format!("backend gloo ({algo}")) && out.contains("# Out of bounds values : 0 OK"),
                "{out}"
            );
            // 8 B .. 256 KiB by 8: 6 rows, each with a time in both column groups
            let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
            assert_eq!(rows.len(), 6, "{out}");
            for r in rows {
                let f: Vec<&str> = r.split_whitespace().collect();
                assert!(
                    f.len() == 13 && f[5].parse::<f64>().is_ok_and(|t| t > 0.0) && f[8] == "0" && f[12] == "0",
                    "{r}"
                );
            }
        }
    }
}

#[test]
fn gloo_sweep_is_plotted_and_saved_like_ccls() {
    let tmp = std::env::temp_dir();
    let (svg, json) =
        (tmp.join(format!("gloo-{}.svg", std::process::id())), tmp.join(format!("gloo-{}.json", std::process::id())));
    let (svg_arg, json_arg) = (svg.to_string_lossy().into_owned(), json.to_string_lossy().into_owned());
    let o =
        perf(2, &["-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "--plot", &svg_arg, "--json", &json_arg]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plot = std::fs::read_to_string(&svg).expect("svg written");
    assert!(plot.contains("Gloo out_of_place") && plot.contains("Gloo in_place"), "{plot}");
    let doc = std::fs::read_to_string(&json).expect("json written");
    assert!(doc.contains("\"backend\": \"Gloo\"") && doc.contains("\"size\": 65536"), "{doc}");
    let _ = (std::fs::remove_file(svg), std::fs::remove_file(json));
}

#[test]
fn gloo_backend_refuses_what_it_cannot_measure() {
    for (args, says) in [
        (&["-C", "broadcast"][..], "measures all_reduce float sum only"),
        (&["-d", "double"], "measures all_reduce float sum only"),
        (&["--algo", "tree"], "not \"tree\""),
    ] {
        let o = perf(2, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
    }
    // outside cclrun there is no rank to be
    let bin = ccl_integration::cclrun().with_file_name("ccl-perf");
    let o = Command::new(bin).args(["--backend", "gloo"]).env_remove("CCL_UNIQUE_ID").output().expect("ccl-perf");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("runs under cclrun"));
}
