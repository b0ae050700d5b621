//! Symbolic verification of schedules.
//!
//! Every input element starts as a symbol `(position, {rank})`. All ranks'
//! schedules are executed together, slot by slot, over FIFOs of a bounded
//! number of slots, exactly as the executor moves data: a reduction of two
//! symbols must be of the same position and of disjoint rank sets (or it
//! counts a contribution twice). At the end, every output element must be
//! the right symbol: all ranks exactly once for reductions, the right
//! single origin for gathers and broadcasts. Before running, the verifier
//! checks that regions fit their buffers, that fused steps alias their
//! operands exactly or not at all, that channels of a rank write disjoint
//! memory, and that the message lengths on every connection match in order.
//! A run that stops with steps left is a deadlock for that slot count.
//! What a send lends (sends from where it lies, [`lend::plan`]) no step may
//! write until the call ends, unless a slot is held for it and the writer
//! takes it back first; the same holds for memory a receive lands in.
//! Schedules that reach their peers' buffers ([`shared`](super::shared))
//! are proved free of races on them (`races.rs`).

mod case;
mod races;

pub use case::Case;

use super::schedule::{Buf, Layout, Region, Schedule, Step};
use super::{generate, lend, Coll, Params};
use std::collections::{HashMap, VecDeque};

/// A symbolic element: a position and the set of ranks whose contribution
/// it holds. An empty set means "never written".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sym {
    idx: u32,
    mask: u64,
}

const UNDEF: Sym = Sym { idx: u32::MAX, mask: 0 };

/// What a successful verification saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Steps over all ranks.
    pub steps: usize,
    /// Messages over all connections.
    pub messages: usize,
}

type ConnKey = (usize, usize, usize); // (from, to, channel)

struct RankState {
    sched: Schedule,
    layout: Layout,
    mem: [Vec<Sym>; 3],
    pc: Vec<(usize, usize)>, // per channel: (step, slot within step)
    /// How its steps share the call's memory with a socket ([`lend::plan`]).
    lending: lend::Lending,
    /// The memory lent so far (and whether a slot is held for it): a
    /// socket may read it until the call ends or it is taken back.
    lent: Vec<(Region, bool)>,
}

/// The index of one of a rank's own (resolved) buffers in its memory.
fn bi(b: Buf) -> usize {
    match b {
        Buf::Input => 0,
        Buf::Output => 1,
        _ => 2,
    }
}

/// Where rank `r`'s region `g` lies: the rank whose memory it is, which
/// of its buffers (input, output, scratch) and the resolved region.
fn locate(ranks: &[RankState], r: usize, g: Region) -> Result<(usize, usize, Region), String> {
    let (q, b) = match g.buf {
        Buf::Input | Buf::Output | Buf::Scratch => {
            let g = ranks[r].layout.resolve(g);
            return Ok((r, bi(g.buf), g));
        }
        Buf::PeerInput(q) => (q as usize, 0),
        Buf::PeerOutput(q) => (q as usize, 1),
    };
    let fits = ranks.get(q).is_some_and(|p| g.end() <= p.mem[b].len() && (b == 1 || p.layout.in_place.is_none()));
    if !fits {
        return Err(format!("{:?}[{}..{}] is not in rank {q}'s buffers", g.buf, g.off, g.end()));
    }
    Ok((q, b, g))
}

/// Generates every rank's schedule for `case` and proves it; the error
/// says which rank and step broke which rule.
pub fn verify(case: &Case) -> Result<Report, String> {
    verify_with(case, &|coll, p| generate(coll, case.algo, p))
}

/// Proves the schedules `gen` returns for each rank (for testing the
/// verifier itself on schedules no generator would produce).
pub fn verify_with(case: &Case, gen: &dyn Fn(Coll, &Params) -> Result<Schedule, String>) -> Result<Report, String> {
    verify_lending(case, gen, &lend::plan)
}

/// [`verify_with`], with how steps share memory with sockets marked by
/// `lend` (the verifier's own tests mark it wrongly on purpose).
fn verify_lending(
    case: &Case,
    gen: &dyn Fn(Coll, &Params) -> Result<Schedule, String>,
    lend: &dyn Fn(&Schedule, &Layout) -> lend::Lending,
) -> Result<Report, String> {
    let n = case.nranks;
    if n == 0 || n > 64 {
        return Err(format!("verifier handles 1..=64 ranks, not {n}"));
    }
    let mut ranks = Vec::with_capacity(n);
    for r in 0..n {
        let Some((coll, root)) = case.coll_of(r) else {
            ranks.push(RankState {
                sched: Schedule::default(),
                layout: Layout { input: 0, output: 0, in_place: None },
                mem: [vec![], vec![], vec![]],
                pc: vec![],
                lending: lend::Lending { send: vec![], takes_back: vec![], lands: vec![] },
                lent: vec![],
            });
            continue;
        };
        let p = Params {
            nranks: n,
            rank: r,
            count: case.count,
            root,
            channels: case.channels,
            chunk: case.chunk,
            in_place: case.in_place,
            around: case.around,
            hosts: &case.hosts,
            blocks: case.blocks.as_ref().map(|v| &v[r]),
        };
        let sched = gen(coll, &p)?;
        let layout = p.layout(coll).ok_or_else(|| format!("{coll} has no form of variable blocks"))?;
        let mut mem = [
            vec![UNDEF; layout.capacity(Buf::Input, 0)],
            vec![UNDEF; layout.capacity(Buf::Output, 0)],
            vec![UNDEF; sched.scratch],
        ];
        for i in 0..layout.input {
            let at = layout.resolve(Region::new(Buf::Input, i, 1));
            mem[bi(at.buf)][at.off] = case.initial(r, i);
        }
        if coll == Coll::Barrier {
            if let Some(s) = mem[2].first_mut() {
                *s = Sym { idx: 0, mask: 1 << r };
            }
        }
        check_static(r, &sched, &layout)?;
        let pc = vec![(0, 0); sched.channels.len()];
        let lending = lend(&sched, &layout);
        ranks.push(RankState { sched, layout, mem, pc, lending, lent: vec![] });
    }
    let messages = check_matching(&ranks)?;
    let mut races = shared_memory(&ranks)?;
    simulate(case, &mut ranks, &mut races)?;
    if let Some(races) = &races {
        (0..n).try_for_each(|r| races.returns(r))?;
    }
    check_outputs(case, &ranks)?;
    Ok(Report { steps: ranks.iter().map(|s| s.sched.steps()).sum(), messages })
}

/// Bounds, aliasing, channel independence, no messages to oneself.
fn check_static(r: usize, s: &Schedule, l: &Layout) -> Result<(), String> {
    let mut writes: Vec<Vec<(Buf, usize, usize)>> = vec![Vec::new(); s.channels.len()];
    let mut touches: Vec<Vec<(Buf, usize, usize)>> = vec![Vec::new(); s.channels.len()];
    for (c, ch) in s.channels.iter().enumerate() {
        for (i, st) in ch.iter().enumerate() {
            let here = || format!("rank {r} channel {c} step {i} ({st:?})");
            if st.send_peer() == Some(r) || st.recv_peer() == Some(r) {
                return Err(format!("{}: message to itself", here()));
            }
            let mut regs = st.reads();
            regs.extend(st.writes());
            for g in &regs {
                let g = l.resolve(*g);
                if g.end() > l.capacity(g.buf, s.scratch) {
                    return Err(format!("{}: region past the end of {:?}", here(), g.buf));
                }
                touches[c].push((g.buf, g.off, g.end()));
            }
            if let Some(w) = st.writes() {
                let w = l.resolve(w);
                writes[c].push((w.buf, w.off, w.end()));
                for g in st.reads() {
                    let g = l.resolve(g);
                    if g.overlaps(&w) && g != w {
                        return Err(format!("{}: operands overlap partially", here()));
                    }
                }
            }
        }
    }
    for (a, wa) in writes.iter().enumerate() {
        for (b, tb_list) in touches.iter().enumerate() {
            if a == b {
                continue;
            }
            for &(wb, ws, we) in wa {
                if tb_list.iter().any(|&(tb, ts, te)| tb == wb && ts < we && ws < te) {
                    return Err(format!("rank {r}: channel {a} writes {wb:?}[{ws}..{we}] that channel {b} also uses"));
                }
            }
        }
    }
    Ok(())
}

/// Where a schedule reaches its peers' buffers, the race checker; such a
/// schedule reaches its own buffers the same way, never as its own
/// `Input` or `Output` (which would hide their accesses from the checker).
fn shared_memory(ranks: &[RankState]) -> Result<Option<races::Races>, String> {
    let regions = |st: &RankState| -> Vec<Region> {
        let steps = st.sched.channels.iter().flatten();
        steps.flat_map(|s| s.reads().into_iter().chain(s.writes())).collect()
    };
    let peers = |st: &RankState| regions(st).iter().any(|g| g.buf.peer().is_some());
    if !ranks.iter().any(peers) {
        return Ok(None);
    }
    for (r, st) in ranks.iter().enumerate() {
        if regions(st).iter().any(|g| matches!(g.buf, Buf::Input | Buf::Output)) {
            return Err(format!("rank {r} reaches its own buffers both directly and as a peer's"));
        }
    }
    let lens: Vec<(usize, usize)> = ranks.iter().map(|st| (st.mem[0].len(), st.mem[1].len())).collect();
    let per = ranks.iter().map(|st| st.sched.channels.len()).max().unwrap_or(1);
    Ok(Some(races::Races::new(&lens, per)))
}

/// Per connection, the sends and receives must agree in number and length.
fn check_matching(ranks: &[RankState]) -> Result<usize, String> {
    let mut sent: HashMap<ConnKey, Vec<usize>> = HashMap::new();
    let mut recvd: HashMap<ConnKey, Vec<usize>> = HashMap::new();
    for (r, st) in ranks.iter().enumerate() {
        for (c, ch) in st.sched.channels.iter().enumerate() {
            for step in ch {
                if let Some(to) = step.send_peer() {
                    sent.entry((r, to, c)).or_default().push(step.len());
                }
                if let Some(from) = step.recv_peer() {
                    recvd.entry((from, r, c)).or_default().push(step.len());
                }
            }
        }
    }
    let mut keys: Vec<_> = sent.keys().chain(recvd.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let mut total = 0;
    for k in keys {
        let (s, r) = (sent.get(&k).cloned().unwrap_or_default(), recvd.get(&k).cloned().unwrap_or_default());
        if s != r {
            return Err(format!("connection {}→{} channel {}: sends {:?} but receives {:?}", k.0, k.1, k.2, s, r));
        }
        total += s.len();
    }
    Ok(total)
}

fn combine(a: Sym, b: Sym, union: bool) -> Result<Sym, String> {
    if a.mask == 0 || b.mask == 0 {
        return Err("reduces data that was never written".into());
    }
    if a.idx != b.idx {
        return Err(format!("reduces position {} with position {}", a.idx, b.idx));
    }
    if !union && a.mask & b.mask != 0 {
        return Err(format!("counts ranks {:#x} twice", a.mask & b.mask));
    }
    Ok(Sym { idx: a.idx, mask: a.mask | b.mask })
}

/// Slots a message of `len` elements takes, and the element range of slot `u`.
fn slots(len: usize, se: usize) -> usize {
    len.div_ceil(se).max(1)
}

/// The elements of rank `r`'s region `g` that slot `u` covers (a local
/// step, `whole`: all of them), as (rank, buffer, resolved slice).
fn slot_of(ranks: &[RankState], r: usize, g: Region, (u, se, whole): (usize, usize, bool)) -> Result<(usize, usize, Region), String> {
    let (q, b, g) = locate(ranks, r, g)?;
    if whole {
        return Ok((q, b, g));
    }
    let s = (g.off + u * se).min(g.end());
    Ok((q, b, Region::new(g.buf, s, (g.off + (u + 1) * se).min(g.end()) - s)))
}

/// What channel `c` of rank `r` reads at `at` ([`slot_of`]).
fn read(ranks: &[RankState], races: &mut Option<races::Races>, (r, c): (usize, usize), at: (usize, usize, Region)) -> Result<Vec<Sym>, String> {
    let (q, b, g) = at;
    let v = ranks[q].mem[b][g.off..g.end()].to_vec();
    if v.iter().any(|x| x.mask == 0) {
        return Err(format!("reads never-written data at {:?}[{}..{}]", g.buf, g.off, g.end()));
    }
    if let (Some(races), true) = (races.as_mut(), b < 2) {
        races.access((r, c), (q, b, g.off, g.end()), false)?;
    }
    Ok(v)
}

/// Channel `c` of rank `r` writes `v` at `at` ([`slot_of`]).
fn write(ranks: &mut [RankState], races: &mut Option<races::Races>, (r, c): (usize, usize), at: (usize, usize, Region), v: &[Sym]) -> Result<(), String> {
    let (q, b, g) = at;
    if let (Some(races), true) = (races.as_mut(), b < 2) {
        races.access((r, c), (q, b, g.off, g.off + v.len()), true)?;
    }
    ranks[q].mem[b][g.off..g.off + v.len()].copy_from_slice(v);
    Ok(())
}

/// Memory region `w` is about to be written (or landed in, as `what`
/// says): lent memory there is an error, held memory must be taken back
/// (`takes_back`), and then is no longer lent.
fn take_back(lent: &mut Vec<(Region, bool)>, w: Region, takes_back: bool, what: &str) -> Result<(), String> {
    let here = |why: &str| format!("{what} {:?}[{}..{}], {why}", w.buf, w.off, w.end());
    if lent.iter().any(|(l, held)| !held && l.overlaps(&w)) {
        return Err(here("which an earlier send lent to its connection"));
    }
    if lent.iter().any(|(l, _)| l.overlaps(&w)) {
        if !takes_back {
            return Err(here("which a send still holds, without taking it back"));
        }
        lent.retain(|(l, _)| !l.overlaps(&w));
    }
    Ok(())
}

/// A message in flight: one slot's symbols, and the sender's clock where
/// races are checked.
type Message = (Vec<Sym>, Option<Vec<u32>>);

/// Runs every rank's channels slot by slot until all finish or none can move.
fn simulate(case: &Case, ranks: &mut [RankState], races: &mut Option<races::Races>) -> Result<(), String> {
    let (se, cap, union) = (case.slot_elems.max(1), case.nslots.max(1), case.coll == Coll::Barrier);
    let mut fifo: HashMap<ConnKey, VecDeque<Message>> = HashMap::new();
    loop {
        let mut moved = false;
        for r in 0..ranks.len() {
            for c in 0..ranks[r].pc.len() {
                while advance((r, c), ranks, races, &mut fifo, (se, cap, union)).map_err(|e| {
                    let (i, _) = ranks[r].pc[c];
                    format!("rank {r} channel {c} step {i} ({:?}): {e}", ranks[r].sched.channels[c].get(i))
                })? {
                    moved = true;
                }
            }
        }
        if !moved {
            break;
        }
    }
    let stuck: Vec<String> = ranks
        .iter()
        .enumerate()
        .flat_map(|(r, st)| {
            st.pc.iter().enumerate().filter_map(move |(c, &(i, _))| {
                st.sched.channels[c].get(i).map(|s| format!("rank {r} ch {c} step {i} {s:?}"))
            })
        })
        .collect();
    if !stuck.is_empty() {
        return Err(format!("deadlock with {cap} slots of {se} elements: {}", stuck.join("; ")));
    }
    if let Some((k, _)) = fifo.iter().find(|(_, q)| !q.is_empty()) {
        return Err(format!("messages left unreceived on {}→{} channel {}", k.0, k.1, k.2));
    }
    Ok(())
}

/// Moves rank `r`'s channel `c` one slot (or one local step) forward.
fn advance(
    (r, c): (usize, usize),
    ranks: &mut [RankState],
    races: &mut Option<races::Races>,
    fifo: &mut HashMap<ConnKey, VecDeque<Message>>,
    (se, cap, union): (usize, usize, bool),
) -> Result<bool, String> {
    let (i, u) = ranks[r].pc[c];
    let Some(&step) = ranks[r].sched.channels[c].get(i) else {
        return Ok(false);
    };
    let inbox = step.recv_peer().map(|f| (f, r, c));
    let outbox = step.send_peer().map(|t| (r, t, c));
    if inbox.is_some_and(|k| fifo.get(&k).is_none_or(|q| q.is_empty())) {
        return Ok(false);
    }
    if outbox.is_some_and(|k| fifo.get(&k).is_some_and(|q| q.len() >= cap)) {
        return Ok(false);
    }
    let sent_at = races.as_mut().map(|x| x.tick(r, c));
    let incoming = match inbox {
        Some(k) => {
            let (v, clock) = fifo.get_mut(&k).and_then(|q| q.pop_front()).unwrap_or_default();
            let want = (step.len() - u * se).min(se);
            if v.len() != want {
                return Err(format!("slot of {} elements where {want} were expected", v.len()));
            }
            if let (Some(races), Some(clock)) = (races.as_mut(), clock) {
                races.receive(r, c, &clock);
            }
            Some(v)
        }
        None => None,
    };
    let whole = step.is_local();
    // the memory this slot (a local step: its whole region) covers
    let at = |ranks: &[RankState], g: Region| slot_of(ranks, r, g, (u, se, whole));
    let st = &mut ranks[r];
    let takes_back = st.lending.takes_back[c][i];
    // a landing step's destination is the socket's from its first slot on
    if u == 0 && st.lending.lands[c][i] {
        if let Some(d) = lend::landing(&step).map(|d| st.layout.resolve(d)) {
            take_back(&mut st.lent, d, takes_back, "lands in")?;
        }
    }
    if let Some(w) = step.writes() {
        let (_, _, w) = at(ranks, w)?;
        take_back(&mut ranks[r].lent, w, takes_back, "writes")?;
    }
    let mode = ranks[r].lending.send[c][i];
    if mode != lend::SendMode::Slot {
        if let Some(g) = step.sends_as_is() {
            let (_, _, g) = at(ranks, g)?;
            ranks[r].lent.push((g, mode == lend::SendMode::Hold));
        }
    }
    let me = (r, c);
    let reduced = |ranks: &[RankState], races: &mut Option<races::Races>, src: Region, inc: &[Sym]| {
        let mine = read(ranks, races, me, at(ranks, src)?)?;
        mine.iter().zip(inc).map(|(a, b)| combine(*a, *b, union)).collect::<Result<Vec<Sym>, String>>()
    };
    let inc = incoming.unwrap_or_default();
    let out = match step {
        Step::Send { src, .. } => Some(read(ranks, races, me, at(ranks, src)?)?),
        Step::Recv { dst, .. } => {
            write(ranks, races, me, at(ranks, dst)?, &inc)?;
            None
        }
        Step::RecvReduce { src, dst, .. } => {
            let v = reduced(ranks, races, src, &inc)?;
            write(ranks, races, me, at(ranks, dst)?, &v)?;
            None
        }
        Step::RecvReduceSend { src, .. } => Some(reduced(ranks, races, src, &inc)?),
        Step::RecvReduceCopySend { src, dst, .. } => {
            let v = reduced(ranks, races, src, &inc)?;
            write(ranks, races, me, at(ranks, dst)?, &v)?;
            Some(v)
        }
        Step::RecvCopySend { dst, .. } => {
            write(ranks, races, me, at(ranks, dst)?, &inc)?;
            Some(inc)
        }
        Step::Copy { src, dst } => {
            let (a, b) = (at(ranks, src)?, at(ranks, dst)?);
            if a != b {
                let v = read(ranks, races, me, a).map_err(|_| "copies never-written data".to_string())?;
                write(ranks, races, me, b, &v)?;
            }
            None
        }
        Step::Reduce { src, dst } => {
            let (a, b) = (at(ranks, src)?, at(ranks, dst)?);
            let (x, y) = (read(ranks, races, me, a)?, read(ranks, races, me, b)?);
            let v = y.iter().zip(&x).map(|(p, q)| combine(*p, *q, union)).collect::<Result<Vec<Sym>, String>>()?;
            write(ranks, races, me, b, &v)?;
            None
        }
        Step::Notify { .. } => Some(Vec::new()),
        Step::Wait { .. } => None,
    };
    if let (Some(k), Some(v)) = (outbox, out) {
        fifo.entry(k).or_default().push_back((v, sent_at));
    }
    let st = &mut ranks[r];
    st.pc[c] = if whole || u + 1 >= slots(step.len(), se) { (i + 1, 0) } else { (i, u + 1) };
    Ok(true)
}

fn check_outputs(case: &Case, ranks: &[RankState]) -> Result<(), String> {
    for (r, st) in ranks.iter().enumerate() {
        if case.coll == Coll::Barrier {
            let got = st.mem[2].first().copied().unwrap_or(UNDEF);
            if st.sched.scratch > 0 && got.mask != case.full_mask() {
                return Err(format!("rank {r} leaves the barrier having heard from {:#x} only", got.mask));
            }
            continue;
        }
        for q in 0..st.layout.output {
            let Some(want) = case.expected(r, q) else {
                continue;
            };
            let at = st.layout.resolve(Region::new(Buf::Output, q, 1));
            let got = st.mem[bi(at.buf)][at.off];
            if got != want {
                return Err(format!(
                    "rank {r} output[{q}]: position {} from ranks {:#x}, expected position {} from ranks {:#x}",
                    got.idx, got.mask, want.idx, want.mask
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algo;
    use crate::topo::Hosts;
    use crate::algo::Step::*;

    const IN: Region = Region::new(Buf::Input, 0, 1);
    const OUT: Region = Region::new(Buf::Output, 0, 1);

    fn two_ranks(coll: Coll) -> Case {
        Case {
            coll,
            algo: Algo::Ring,
            nranks: 2,
            count: 1,
            root: 0,
            channels: 1,
            chunk: 1,
            in_place: false,
            around: false,
            hosts: Hosts::flat(2),
            slot_elems: 1,
            nslots: 2,
            blocks: None,
        }
    }

    fn run(steps: [Vec<Vec<Step>>; 2]) -> Result<Report, String> {
        verify_with(&two_ranks(Coll::AllReduce), &|_, p| Ok(Schedule { channels: steps[p.rank].clone(), scratch: 0 }))
    }

    #[test]
    fn accepts_a_correct_hand_written_exchange() {
        let r = |peer| vec![vec![Send { to: peer, src: IN }, RecvReduce { from: peer, src: IN, dst: OUT }]];
        assert_eq!(run([r(1), r(0)]).map(|x| x.messages), Ok(2));
    }

    #[test]
    fn rejects_counting_a_rank_twice() {
        // rank 1 sends back a sum that already holds rank 0's part
        let r0 = vec![vec![Send { to: 1, src: IN }, RecvReduce { from: 1, src: IN, dst: OUT }]];
        let r1 = vec![vec![RecvReduce { from: 0, src: IN, dst: OUT }, Send { to: 0, src: OUT }]];
        let e = run([r0, r1]).expect_err("double count");
        assert!(e.contains("counts ranks 0x1 twice"), "{e}");
    }

    #[test]
    fn rejects_reading_unwritten_output() {
        let r = |peer| vec![vec![Send { to: peer, src: OUT }, RecvReduce { from: peer, src: IN, dst: OUT }]];
        let e = run([r(1), r(0)]).expect_err("undefined");
        assert!(e.contains("never-written"), "{e}");
    }

    #[test]
    fn rejects_channels_writing_the_same_memory() {
        let r = |peer| {
            vec![
                vec![Send { to: peer, src: IN }, RecvReduce { from: peer, src: IN, dst: OUT }],
                vec![Copy { src: IN, dst: OUT }],
            ]
        };
        let e = run([r(1), r(0)]).expect_err("race");
        assert!(e.contains("channel 0 writes"), "{e}");
    }

    #[test]
    fn rejects_mismatched_messages_and_missing_results() {
        let e = run([vec![vec![Send { to: 1, src: IN }]], vec![vec![]]]).expect_err("unmatched");
        assert!(e.contains("sends [1] but receives []"), "{e}");
        let e = run([vec![vec![Copy { src: IN, dst: OUT }]], vec![vec![Copy { src: IN, dst: OUT }]]])
            .expect_err("not reduced");
        assert!(e.contains("expected position 0 from ranks 0x3"), "{e}");
    }

    #[test]
    fn rejects_regions_past_the_buffer() {
        let far = Region::new(Buf::Output, 1, 1);
        let e = run([vec![vec![Copy { src: IN, dst: far }]], vec![vec![]]]).expect_err("bounds");
        assert!(e.contains("past the end"), "{e}");
    }

    #[test]
    fn lending_marks_the_verifier_refuses() {
        // in place, a ring all-reduce receives the reduced piece it sent
        // first into where it sent it from
        let case = Case { in_place: true, count: 8, ..two_ranks(Coll::AllReduce) };
        let gen = |coll, p: &Params| generate(coll, Algo::Ring, p);
        assert!(verify_lending(&case, &gen, &lend::plan).is_ok());
        // every such send lent without a slot held for it
        let unheld = |s: &Schedule, l: &Layout| {
            let mut m = lend::plan(s, l);
            m.send.iter_mut().flatten().filter(|x| **x == lend::SendMode::Hold).for_each(|x| *x = lend::SendMode::Lend);
            m
        };
        let e = verify_lending(&case, &gen, &unheld).expect_err("refused");
        assert!(e.contains("which an earlier send lent to its connection"), "{e}");
        // held, but nothing taken back: the landing receive finds it first
        let kept = |s: &Schedule, l: &Layout| {
            let mut m = lend::plan(s, l);
            m.takes_back.iter_mut().flatten().for_each(|t| *t = false);
            m
        };
        let e = verify_lending(&case, &gen, &kept).expect_err("refused");
        assert!(e.contains("lands in") && e.contains("without taking it back"), "{e}");
        // and with no landing, the write does
        let written = |s: &Schedule, l: &Layout| {
            let mut m = kept(s, l);
            m.lands.iter_mut().flatten().for_each(|t| *t = false);
            m
        };
        let e = verify_lending(&case, &gen, &written).expect_err("refused");
        assert!(e.starts_with("rank") && e.contains("writes") && e.contains("without taking it back"), "{e}");
    }

    #[test]
    fn races_on_shared_buffers_are_refused() {
        let case = Case { algo: Algo::Direct, nranks: 3, count: 12, chunk: 2, hosts: Hosts::flat(3), ..two_ranks(Coll::AllReduce) };
        let fences = |s: &Schedule| s.channels[0].iter().filter(|st| matches!(st, Notify { .. } | Wait { .. })).count();
        // the schedules as made, then without their first or last fence
        let gen = |coll, p: &Params, cut: Option<bool>| {
            let mut s = generate(coll, Algo::Direct, p)?;
            let half = fences(&s) / 2;
            let ch = &mut s.channels[0];
            match cut {
                Some(true) => drop(ch.drain(..half)),
                Some(false) => ch.truncate(ch.len() - half),
                None => {}
            }
            Ok(s)
        };
        let ok = verify_with(&case, &|c, p| gen(c, p, None));
        assert!(ok.is_ok(), "{ok:?}");
        let e = verify_with(&case, &|c, p| gen(c, p, Some(true))).expect_err("reads before the owner entered");
        assert!(e.contains("reads rank") && e.contains("unordered with it"), "{e}");
        let e = verify_with(&case, &|c, p| gen(c, p, Some(false))).expect_err("returns under the others' feet");
        assert!(e.contains("returns while rank"), "{e}");
        // two ranks writing the same output
        let both = |coll, p: &Params| {
            let mut s = generate(coll, Algo::Direct, p)?;
            let dst = Region::new(Buf::PeerOutput(0), 0, 1);
            let at = fences(&s) / 2;
            s.channels[0].insert(at, Copy { src: Region::new(Buf::PeerInput(p.rank as u32), 0, 1), dst });
            Ok(s)
        };
        let e = verify_with(&Case { in_place: false, ..case.clone() }, &both).expect_err("racing writes");
        assert!(e.contains("writes rank 0's output[0]"), "{e}");
        // a schedule reaching its own buffers directly as well as a peer's
        let mixed = |coll, p: &Params| {
            let mut s = generate(coll, Algo::Direct, p)?;
            let own = Region::new(Buf::PeerOutput(p.rank as u32), 0, 1);
            s.channels[0].push(Copy { src: Region::new(Buf::Input, 0, 1), dst: own });
            Ok(s)
        };
        let e = verify_with(&case, &mixed).expect_err("mixed");
        assert!(e.contains("both directly and as a peer's"), "{e}");
    }
}
