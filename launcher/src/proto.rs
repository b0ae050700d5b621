//! What cclrun and `cclrun agent` say to each other over an SSH channel.
//!
//! cclrun → agent (the agent's stdin): one JSON line, the [`HostJob`];
//! after the agent says `READY`, the line `GO` (start the ranks) and then
//! any number of [`Order`]s: `SIG <n>` (signal every rank) and
//! `LOST <host> <rank>,<rank>... <why>` (ranks of another host that cclrun
//! gave up on, for the ranks here that wait on them). End of input means cclrun is
//! gone: the agent ends its ranks.
//!
//! agent → cclrun (its stdout), one message a line: `READY`, `FAIL <why>`,
//! `PID <rank> <pid>`, `OUT <rank> <bytes>`, `ERR <rank> <bytes>`,
//! `EXIT <rank> <code|-> <signal|->`, and `DONE` once every rank has ended.
//! Output lines travel as the ranks wrote them, bytes included.

use serde::{Deserialize, Serialize};

/// One rank of a host's share of the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSpec {
    /// World rank.
    pub rank: usize,
    /// Rank among this host's ranks.
    pub local_rank: usize,
    /// Ranks on this host.
    pub local_size: usize,
}

/// What one host must run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostJob {
    /// The host's name, for messages.
    pub host: String,
    /// The program, resolved on that host.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Working directory (cclrun's own, as mpirun does).
    pub cwd: Option<String>,
    /// Environment every rank gets (`-x`, `CCL_*`, `CCL_UNIQUE_ID`).
    pub env: Vec<(String, String)>,
    /// The ranks to start there.
    pub ranks: Vec<RankSpec>,
    /// World size.
    pub world: usize,
    /// How ranks are pinned to CPUs.
    #[serde(default)]
    pub bind: Bind,
}

/// How a host's ranks are pinned to CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Bind {
    /// As `core` on a host where the job's ranks outnumber the CPUs the
    /// launcher may use and split evenly over them, as `none` elsewhere.
    #[default]
    Auto,
    /// Not at all: the kernel places them.
    None,
    /// Local rank i to the i-th CPU the launcher may use, in contiguous
    /// blocks when ranks outnumber CPUs.
    Core,
}

/// How a rank ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal, if one killed it.
    pub signal: Option<i32>,
}

impl Status {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Something that happened to a rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// It started with this pid (on its host).
    Started {
        /// World rank.
        rank: usize,
        /// Its pid.
        pid: u32,
    },
    /// It wrote a line.
    Output {
        /// World rank.
        rank: usize,
        /// On stderr.
        err: bool,
        /// The line, newline included.
        line: Vec<u8>,
    },
    /// It ended.
    Exit {
        /// World rank.
        rank: usize,
        /// How.
        status: Status,
    },
}

/// A line from the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// The program was found; waiting for `GO`.
    Ready,
    /// The agent cannot run this job.
    Fail(String),
    /// A rank event.
    Event(Event),
    /// Every rank has ended.
    Done,
}

fn opt(v: Option<i32>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// The line (newline included) for `m`.
pub fn encode(m: &Msg) -> Vec<u8> {
    let mut out = match m {
        Msg::Ready => b"READY".to_vec(),
        Msg::Done => b"DONE".to_vec(),
        Msg::Fail(why) => format!("FAIL {}", why.replace('\n', " ")).into_bytes(),
        Msg::Event(Event::Started { rank, pid }) => format!("PID {rank} {pid}").into_bytes(),
        Msg::Event(Event::Exit { rank, status }) => {
            format!("EXIT {rank} {} {}", opt(status.code), opt(status.signal)).into_bytes()
        }
        Msg::Event(Event::Output { rank, err, line }) => {
            let mut v = format!("{} {rank} ", if *err { "ERR" } else { "OUT" }).into_bytes();
            v.extend_from_slice(line.strip_suffix(b"\n").unwrap_or(line));
            v
        }
    };
    out.push(b'\n');
    out
}

/// Parses one line (with or without its newline); garbage is an error.
pub fn decode(line: &[u8]) -> Result<Msg, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let (head, rest) = match line.iter().position(|&b| b == b' ') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, &[][..]),
    };
    let text = || String::from_utf8_lossy(rest).into_owned();
    let bad = || format!("agent sent {:?}", String::from_utf8_lossy(&line[..line.len().min(80)]));
    let num = |s: &str| s.parse::<usize>().map_err(|_| bad());
    let int = |s: &str| if s == "-" { Ok(None) } else { s.parse::<i32>().map(Some).map_err(|_| bad()) };
    Ok(match head {
        b"READY" if rest.is_empty() => Msg::Ready,
        b"DONE" if rest.is_empty() => Msg::Done,
        b"FAIL" => Msg::Fail(text()),
        b"OUT" | b"ERR" => {
            let i = rest.iter().position(|&b| b == b' ').ok_or_else(bad)?;
            let rank = num(std::str::from_utf8(&rest[..i]).map_err(|_| bad())?)?;
            let mut l = rest[i + 1..].to_vec();
            l.push(b'\n');
            Msg::Event(Event::Output { rank, err: head == b"ERR", line: l })
        }
        b"PID" | b"EXIT" => {
            let t = text();
            let w: Vec<&str> = t.split(' ').collect();
            match (head, w.as_slice()) {
                (b"PID", [r, p]) => Msg::Event(Event::Started { rank: num(r)?, pid: p.parse().map_err(|_| bad())? }),
                (b"EXIT", [r, c, s]) => {
                    Msg::Event(Event::Exit { rank: num(r)?, status: Status { code: int(c)?, signal: int(s)? } })
                }
                _ => return Err(bad()),
            }
        }
        _ => return Err(bad()),
    })
}

/// What cclrun tells an agent once its ranks run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// Signal every rank.
    Signal(i32),
    /// These ranks of another host are lost, for a reason.
    Lost {
        /// Their host, as the hostfile names it.
        host: String,
        /// The ranks.
        ranks: Vec<usize>,
        /// Why.
        why: String,
    },
}

/// One order as a line.
pub fn encode_order(o: &Order) -> Vec<u8> {
    match o {
        Order::Signal(sig) => format!("SIG {sig}\n"),
        Order::Lost { host, ranks, why } => {
            let ranks: Vec<String> = ranks.iter().map(usize::to_string).collect();
            let host = host.replace(char::is_whitespace, "_");
            format!("LOST {host} {} {}\n", ranks.join(","), why.replace('\n', " "))
        }
    }
    .into_bytes()
}

/// Parses one order line; `None` for anything else.
pub fn decode_order(line: &[u8]) -> Option<Order> {
    let line = std::str::from_utf8(line).ok()?.trim_end();
    if let Some(sig) = line.strip_prefix("SIG ") {
        return sig.parse().ok().map(Order::Signal);
    }
    let mut w = line.strip_prefix("LOST ")?.splitn(3, ' ');
    let (host, ranks, why) = (w.next()?, w.next()?, w.next()?);
    let ranks = ranks.split(',').map(|r| r.parse().ok()).collect::<Option<Vec<usize>>>()?;
    Some(Order::Lost { host: host.to_string(), ranks, why: why.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            Msg::Ready,
            Msg::Done,
            Msg::Fail("./app: no such file".into()),
            Msg::Event(Event::Started { rank: 3, pid: 4242 }),
            Msg::Event(Event::Output { rank: 7, err: true, line: b"bytes \xff and spaces \n".to_vec() }),
            Msg::Event(Event::Output { rank: 0, err: false, line: b"\n".to_vec() }),
            Msg::Event(Event::Exit { rank: 1, status: Status { code: Some(3), signal: None } }),
            Msg::Event(Event::Exit { rank: 2, status: Status { code: None, signal: Some(9) } }),
        ];
        for m in msgs {
            assert_eq!(decode(&encode(&m)).expect("decodes"), m);
        }
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in [&b""[..], b"HELLO", b"OUT x y", b"OUT 3", b"PID 1", b"EXIT 1 2", b"EXIT 1 a -", b"READY now"] {
            assert!(decode(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn orders_round_trip_and_garbage_is_none() {
        let lost = |host: &str, ranks: &[usize], why: &str| Order::Lost {
            host: host.into(),
            ranks: ranks.to_vec(),
            why: why.into(),
        };
        let orders = [
            Order::Signal(15),
            lost("host3", &[4], "cclrun lost it"),
            lost("10.1.2.3", &[4, 5, 63], "cclrun lost its connection to it (connection lost: transport read)"),
        ];
        for o in orders {
            assert_eq!(decode_order(&encode_order(&o)), Some(o));
        }
        let flat = encode_order(&lost("a host", &[1], "two\nlines"));
        assert_eq!(decode_order(&flat), Some(lost("a_host", &[1], "two lines")));
        for bad in
            [&b"GO"[..], b"SIG", b"SIG x", b"LOST", b"LOST h 4", b"LOST h 4,x why", b"LOST h ,4 why", b"LOST 4 why"]
        {
            assert_eq!(decode_order(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
