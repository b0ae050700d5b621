//! The closed form of the trees: the double tree's all-reduce and the
//! rooted trees' broadcast and reduce, priced along their deepest path.

use super::*;

/// Where a double tree's channels cross between hosts of `p` ranks with
/// `nics` links: channel `ch`'s first tree at local rank `ch`, its second
/// at `ch - 1` (modulo `p`, the chains rotated as the rings are), each rank
/// on link `local % nics`. Per link: the channels crossing there in the
/// first tree and in the second.
pub(super) fn tree_heads(c: f64, p: usize, nics: usize) -> Vec<(f64, f64)> {
    let (c, p, nics) = (c.max(1.0) as usize, p.max(1), nics.max(1));
    let mut on = vec![(0.0, 0.0); nics];
    for ch in 0..c {
        on[(ch % p) % nics].0 += 1.0;
        on[((ch + p - 1) % p) % nics].1 += 1.0;
    }
    on
}

/// The most channels whose double trees cross through one link of a host
/// ([`tree_heads`]), in either tree.
fn tree_crowd(r: &Rates) -> f64 {
    tree_heads(r.channels, r.per_host, r.m.nics).iter().map(|&(a, b)| a.max(b)).fold(1.0, f64::max)
}

/// The deepest path down (or up) a tree, seconds.
struct TreePath {
    /// Its hops, one per level, from the first slot sent to the last
    /// node's step.
    hops: f64,
    /// The work its nodes do first for the children served before the
    /// path's.
    siblings: f64,
    /// What the root, which has one child fewer, would do besides were
    /// it like the others.
    root: f64,
}

/// The [`TreePath`] of pieces of `b` bytes doing `kind`: on one host a
/// node serves its first child first; across hosts, a host's head serves
/// its chain's next rank, then its child hosts one after another through
/// its link. In the double tree (`whole` false) a head takes its chain's
/// piece, then its child hosts', passing it on as it comes, up and down
/// alike. A rooted tree's head (`whole`) passes a piece across hosts only
/// once it has all of it: up to the root, once both child hosts' pieces
/// are in; down from it, once its parent's is.
fn tree_path(r: &Rates, kind: Kind, b: f64, c: f64, whole: bool) -> TreePath {
    let (n, h, p) = (r.n, r.hosts, r.per_host);
    let si = r.hop(kind, b, false, 1.0, c);
    // the first node sends its piece's first slot; the last node's first
    // slot is part of its step
    let ends = r.send_first(b) - si.first;
    if h < 2 {
        // (the in-order tree over n positions: ceil(log2 n) levels)
        let levels = log2_ceil(n);
        // (on GPUs a piece sent down shares the link with its sibling's of
        // its own channel, the other channels' moving beside them)
        let down = kind != Kind::ReduceSend;
        let sibling = if r.m.streams && down { si.each.min(r.work(kind, b).max(r.pull(b))) } else { si.each };
        let more_kids = if most_kids(n) > 1.0 { sibling } else { 0.0 };
        let hops = if levels > 0.0 { ends + levels * si.hop() } else { 0.0 };
        return TreePath { hops, siblings: (levels - 1.0).max(0.0) * more_kids, root: more_kids };
    }
    let sa = r.hop(kind, b, true, if whole { c } else { tree_crowd(r) }, c);
    let (chain, levels) = ((p - 1) as f64, log2_ceil(h));
    let more_kids = if most_kids(h) > 1.0 { sa.each } else { 0.0 };
    let ends = if p > 1 { ends } else { ends + si.first - sa.first };
    let chained = if p > 1 { levels * si.each } else { 0.0 };
    let siblings = if !whole {
        // up: a head takes its chain's piece, then its first child host's
        chained + (levels - 1.0).max(0.0) * more_kids
    } else if kind == Kind::ReduceSend {
        // (`whole`) up to a root: a head with two child hosts passes its
        // piece on only once both of theirs are in, so it takes the path's
        // whole (its channel's bytes, a share of the link's time), and its
        // sibling's too where that comes at the same time
        let (contended, whole_in) = two_kid_levels(h);
        chained + contended * sa.each + whole_in * (sa.each - sa.first) / c
    } else {
        // (`whole`) down from a root: a head below it passes its parent's
        // piece to its chain as it comes, and sends it on to its child
        // hosts, one after another, once the whole of it is in
        (levels - 1.0).max(0.0) * (si.each.max(sa.each) + more_kids)
    };
    TreePath { hops: ends + chain * si.hop() + levels * sa.hop(), siblings, root: more_kids }
}

/// Along the deepest path of the in-order tree over `n` positions (down
/// the complete subtree left of the root's child `t`, the largest power
/// of two below `n`): the nodes whose two children's pieces come at
/// once (every one inside that subtree, and `t` where its right subtree
/// is as deep), and the nodes with two children.
fn two_kid_levels(n: usize) -> (f64, f64) {
    if n < 3 {
        return (0.0, 0.0);
    }
    let t = 1usize << (n - 1).ilog2();
    let inside = (t.ilog2() - 1) as f64;
    let both = |yes: bool| if yes { 1.0 } else { 0.0 };
    (inside + both(n == 2 * t), inside + both(t + 1 < n))
}

/// Seconds the busiest network link takes per piece of a tree's `q`
/// ([`link_bytes`] over them).
fn link_per_piece(call: &Call, r: &Rates, q: f64) -> f64 {
    if r.hosts > 1 {
        link_bytes(call, Algo::Tree, r) / q.max(1.0) / r.bw
    } else {
        0.0
    }
}

/// All-reduce by the double binary tree (two channels, half the data on
/// each tree; across hosts, a tree over hosts with a chain inside each).
pub(super) fn double_tree(call: &Call, r: &Rates, s_ch: f64, c: f64) -> f64 {
    let n = r.n;
    let (q, b) = r.pieces(s_ch / 2.0, call.chunk);
    let more = q.max(1.0);
    let si = |kind| r.hop(kind, b, false, 1.0, c);
    let copy = r.work(Kind::Copy, b) * r.serial;
    if n <= 2 {
        // each rank the root of one tree, which sends what it has just
        // reduced straight back down from the cache, copying nothing more,
        // and the leaf of the other (a piece up, one down)
        let multi = r.hosts > 1;
        let st = |kind| if multi { r.hop(kind, b, true, c, c) } else { si(kind) };
        let (up, down) = (st(Kind::ReduceSend), st(Kind::CopySend));
        let thread = up.each + down.each + 2.0 * copy - (copy - r.m.step * r.slow * r.serial);
        return up.latency + down.latency + more * thread.max(link_per_piece(call, r, more));
    }
    let (up, down) = (tree_path(r, Kind::ReduceSend, b, c, false), tree_path(r, Kind::CopySend, b, c, false));
    // a rank's thread per piece: inner in one tree (two children up, then
    // down to them) and a leaf in the other (a piece up, a piece down)
    let thread = 2.0 * si(Kind::ReduceSend).each + si(Kind::CopySend).each + copy + copy + si(Kind::Copy).each;
    let link = link_per_piece(call, r, more);
    // a node takes piece k - 1 down before it sends k + 1 up: two pieces in
    // flight, so each waits half a round trip along the deepest path and
    // back. A level there costs its hop and a child's piece before the
    // path's, and half as much again for its thread's other work (the
    // other tree's), as the simulator has it.
    let level = |t: &TreePath| 1.5 * (t.hops + t.siblings + t.root);
    let trip = (level(&up) + level(&down) + copy + si(Kind::Copy).each) / 2.0;
    // the first piece along the path: across hosts it queues behind its
    // siblings on a head's link; on one host the simulator finds it in
    // step with its siblings, whose pieces a node has in hand by then
    let fill = up.hops + down.hops + if r.hosts > 1 { up.siblings + down.siblings } else { 0.0 };
    fill + (more * thread.max(link)).max((more - 2.0).max(0.0) * trip + more.min(2.0) * thread)
}

/// Broadcast or reduce down (up) one tree from (to) the root: on one host
/// a binary tree over its ranks; across hosts, a tree over hosts, the
/// root heading its host's chain.
pub(super) fn rooted_tree(call: &Call, r: &Rates, s_ch: f64, c: f64) -> f64 {
    let (q, b) = r.pieces(s_ch, call.chunk);
    let more = q.max(1.0);
    // children of the busiest node: on one host two (one on two or three
    // ranks, a chain); a host's head has its chain's next rank and up to
    // two child hosts
    let kids = if r.hosts > 1 {
        (if r.per_host > 1 { 1.0 } else { 0.0 }) + most_kids(r.hosts)
    } else {
        most_kids(r.n).max(1.0)
    };
    let copy = r.work(Kind::Copy, b) * r.serial;
    let link = link_per_piece(call, r, more);
    // a broadcast's root first copies its whole input into its output (out
    // of place), then each piece into a slot for each child: it has one on
    // a host, and its host's next rank besides across hosts
    let (kind, root, placed) = if call.coll == Coll::Reduce {
        (Kind::ReduceSend, 0.0, 0.0)
    } else {
        let sends = if r.hosts > 1 && r.per_host > 1 { 2.0 } else { 1.0 };
        let placed = if call.in_place { 0.0 } else { r.work(Kind::Copy, s_ch) * r.serial };
        // (on two ranks the one receiving passes nothing on)
        (if r.n > 2 { Kind::CopySend } else { Kind::Copy }, sends * copy, placed)
    };
    let path = tree_path(r, kind, b, c, true);
    let st = r.hop(kind, b, false, 1.0, c);
    // an inner node per piece: takes its children's in turn (reduce), or
    // takes its parent's, passing it to one child and copying it to the others
    let thread = if call.coll == Coll::Reduce || r.m.streams {
        // (on GPUs each child's piece takes the link, down as up)
        kids * st.each
    } else {
        st.each + (kids - 1.0).max(0.0) * copy
    };
    // the first piece along the deepest path ends with one step (as long
    // as its slowest hop's); each further piece takes the busiest node's
    // work for all its children
    let last = if r.hosts > 1 { st.each.max(r.hop(kind, b, true, c, c).each) } else { st.each };
    // (on GPUs of one host a reduction's root takes its second child's
    // piece through its link after its first child's)
    let second = if r.m.streams && r.hosts < 2 && call.coll == Coll::Reduce { path.root } else { 0.0 };
    placed + pipeline(path.hops + path.siblings + second, last, more, thread.max(link).max(root))
}

/// A broadcast root's work on a piece of `b` bytes: its copy into the
/// output (out of place; in place there is nothing to copy) and one
/// into a slot for each of `sends` peers.
pub(super) fn root_copies(call: &Call, r: &Rates, b: f64, sends: f64) -> f64 {
    let placed = if call.in_place { 0.0 } else { 1.0 };
    (placed + sends) * r.work(Kind::Copy, b)
}
