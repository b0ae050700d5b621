//! Snapshots of what cclrun says, so messages change only on purpose.
//! Regenerate with `CCLRUN_SNAPSHOT=overwrite cargo test -p cclrun --test cli`.

use std::process::Command;

fn cclrun(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_cclrun")).args(args).output().expect("run cclrun");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn snapshot(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots").join(name);
    if std::env::var("CCLRUN_SNAPSHOT").as_deref() == Ok("overwrite") || !path.exists() {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        std::fs::write(&path, got).expect("write snapshot");
    }
    let want = std::fs::read_to_string(&path).expect("read snapshot");
    assert_eq!(got, want, "{name} changed; regenerate with CCLRUN_SNAPSHOT=overwrite if intended");
}

#[test]
fn help() {
    let (code, out, _) = cclrun(&["--help"]);
    assert_eq!(code, 0);
    snapshot("help.txt", &out);
}

#[test]
fn usage_errors() {
    let (code, _, err) = cclrun(&["-np", "2"]);
    assert_eq!(code, 2);
    snapshot("missing-program.txt", &err);
    let (code, _, err) = cclrun(&["-np", "0", "true"]);
    assert_eq!((code, err.as_str()), (2, "cclrun: -np must be at least 1\n"));
    let (code, _, err) = cclrun(&["-np", "2", "-x", "CCL_SURELY_UNSET_VARIABLE", "true"]);
    assert_eq!((code, err.as_str()), (2, "cclrun: -x CCL_SURELY_UNSET_VARIABLE: not set in this environment\n"));
    let (code, _, err) = cclrun(&["-np", "2", "--hostfile", "/no/such/hostfile", "true"]);
    assert_eq!(code, 2);
    assert!(err.starts_with("cclrun: /no/such/hostfile: "), "{err}");
    for t in ["-5", "0", "nan", "1e20", "inf"] {
        let (code, _, err) = cclrun(&["-np", "2", "--timeout", t, "true"]);
        assert_eq!(code, 2, "--timeout {t}");
        assert!(err.contains("must be a positive number of seconds"), "{err}");
    }
    // ranks far beyond the CPUs, or the kernel's process ids: refused
    let (code, _, err) = cclrun(&["-np", "100000", "true"]);
    assert_eq!(code, 2);
    assert!(err.contains("ranks per CPU") && err.contains("--oversubscribe"), "{err}");
    let (code, _, err) = cclrun(&["-np", "1000000", "--oversubscribe", "true"]);
    assert_eq!(code, 2);
    assert!(err.contains("pid_max"), "{err}");
    let (code, _, err) = cclrun(&["-np", "100000000", "--oversubscribe", "true"]);
    assert_eq!((code, err.as_str()), (2, "cclrun: -np 100000000: a job has at most 1048576 ranks\n"));
    // ... however they are placed on this host
    for place in [&["-H", "localhost:100000"][..], &["--hostfile", "/dev/stdin"][..]] {
        let (code, _, err) = cclrun(&[&["-np", "100000"][..], place, &["true"]].concat());
        assert_eq!(code, 2, "{place:?}");
        assert!(err.contains("ranks per CPU") || err.contains("not a regular file"), "{place:?}: {err}");
    }
    let dir = std::env::temp_dir().join(format!("cclrun-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, "localhost slots=100000\n").expect("hostfile");
    let (code, _, err) = cclrun(&["-np", "100000", "--hostfile", hosts.to_str().expect("utf-8"), "true"]);
    assert_eq!(code, 2);
    assert!(err.contains("ranks per CPU") && err.contains("--oversubscribe"), "{err}");
    let (code, _, err) = cclrun(&["-np", "1000000", "--oversubscribe", "-H", "localhost:1000000", "true"]);
    assert_eq!(code, 2);
    assert!(err.contains("pid_max"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_line_longer_than_a_mib_is_relayed_in_marked_pieces() {
    // 2.5 MiB of 'x' without a newline, then a short line
    let script = "head -c 2621440 /dev/zero | tr '\\000' x; printf '\\nend\\n'";
    let (code, out, _) = cclrun(&["-np", "1", "sh", "-c", script]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{:?}", lines.iter().map(|l| l.len()).collect::<Vec<_>>());
    let cut = " [cclrun: line cut at 1 MiB, continued on the next]";
    for piece in &lines[..2] {
        assert_eq!(piece.len(), (1 << 20) + cut.len());
        assert!(piece.ends_with(cut));
    }
    assert_eq!(lines[2].len(), 2621440 - (2 << 20));
    assert_eq!(lines[3], "end");
}
