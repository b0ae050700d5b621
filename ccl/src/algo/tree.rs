//! Binary trees: the double binary tree all-reduce, tree broadcast and tree
//! reduce, and the pipelined up/down passes the hierarchical forms reuse.
//!
//! The tree over positions `0..n` is an in-order binary tree hung below
//! position 0, which has a single child (n = 8):
//!
//! ```text
//!        0
//!        │
//!        4
//!      ╱   ╲
//!     2     6
//!    ╱ ╲   ╱ ╲
//!   1   3 5   7
//! ```
//! A node `i > 0` whose lowest set bit is `b` has children `i - b/2` and
//! `i + b/2`; the right child moves closer (`i + b/4`, ...) when it would be
//! past the end. Every position has one parent (checked for n ≤ 1024).
//! The second tree of the double tree relabels positions (mirror for even
//! n, shift by one for odd n), so that the leaves of one are inner nodes of
//! the other and each rank sends about as much as it receives.
//!
//! Across several hosts the tree is over hosts (NCCL's shape): each host's
//! ranks form a chain whose head is the host's node in the binary tree, so
//! only heads cross host boundaries. The second tree relabels the hosts
//! and reverses every chain, so another rank of each host is its head.

use super::part::{npieces, piece, reg, split};
use super::schedule::{Buf, Region, Schedule, Step};
use super::Params;
use std::ops::Range;

/// A tree node's links, as positions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// Parent position, `None` at the root.
    pub parent: Option<usize>,
    /// Child positions (0, 1 or 2).
    pub children: Vec<usize>,
}

/// Node `i` of the in-order binary tree over positions `0..n` (see the
/// module's notes), found without building the others: its children by
/// the rule, its parent by walking down from the root (each node `c` with
/// lowest set bit `b` holds positions `c-b+1 ..= c+b-1` below it, as far
/// as they exist).
pub fn node(n: usize, i: usize) -> Node {
    let children = |c: usize| -> Vec<usize> {
        if c == 0 {
            return if n < 2 { Vec::new() } else { vec![1usize << (usize::BITS - 1 - (n - 1).leading_zeros())] };
        }
        let half = (c & c.wrapping_neg()) / 2;
        if half == 0 {
            return Vec::new();
        }
        let mut h = half;
        while h > 0 && c + h >= n {
            h /= 2;
        }
        std::iter::once(c - half).chain((h > 0).then_some(c + h)).collect()
    };
    let mut parent = None;
    let mut at = 0;
    while at != i {
        let kids = children(at);
        // the child below which `i` lies: the left one holds the positions before it
        let below = if at == 0 || i < at { kids.first() } else { kids.get(1) };
        let Some(&next) = below else { break };
        parent = Some(at);
        at = next;
    }
    Node { parent: if at == i { parent } else { None }, children: if i < n { children(i) } else { Vec::new() } }
}

/// A tree mapped onto ranks: `ranks[pos]` is the rank at each position.
pub struct RankTree {
    /// Parent rank, `None` at the root.
    pub parent: Option<usize>,
    /// Child ranks.
    pub children: Vec<usize>,
}

/// Our node in the tree whose position `i` is held by `order[i]`.
pub fn rank_tree(order: &[usize], me: usize) -> RankTree {
    let pos = order.iter().position(|&r| r == me).unwrap_or(0);
    tree_at(order.len(), |i| order[i], pos)
}

/// Our node, at position `pos`, in the tree over `n` positions whose
/// position `i` is held by rank `at(i)`.
fn tree_at(n: usize, at: impl Fn(usize) -> usize, pos: usize) -> RankTree {
    let node = node(n, pos);
    RankTree { parent: node.parent.map(&at), children: node.children.iter().map(|&c| at(c)).collect() }
}

/// Pipelined reduction up the tree of `src` over `range`: inner nodes
/// accumulate into `acc`, the root ends with the total in `acc`.
pub fn up(ch: &mut Vec<Step>, t: &RankTree, range: &Range<usize>, chunk: usize, src: Buf, acc: Buf) {
    for k in 0..npieces(range.len(), chunk) {
        up_piece(ch, t, &piece(range, chunk, k), src, acc);
    }
}

/// Piece `c` of [`up`].
fn up_piece(ch: &mut Vec<Step>, t: &RankTree, c: &Range<usize>, src: Buf, acc: Buf) {
    let (s, a) = (reg(src, c), reg(acc, c));
    match (t.children.as_slice(), t.parent) {
        ([], Some(parent)) => ch.push(Step::Send { to: parent, src: s }),
        ([], None) => ch.push(Step::Copy { src: s, dst: a }),
        (&[c0], Some(parent)) => ch.push(Step::RecvReduceSend { from: c0, to: parent, src: s }),
        (&[c0], None) => ch.push(Step::RecvReduce { from: c0, src: s, dst: a }),
        (kids, parent) => {
            ch.push(Step::RecvReduce { from: kids[0], src: s, dst: a });
            for (i, &kid) in kids.iter().enumerate().skip(1) {
                match parent {
                    Some(parent) if i + 1 == kids.len() => {
                        ch.push(Step::RecvReduceSend { from: kid, to: parent, src: a })
                    }
                    _ => ch.push(Step::RecvReduce { from: kid, src: a, dst: a }),
                }
            }
        }
    }
}

/// Pipelined broadcast down the tree into `buf` over `range`; the root
/// sends from `root_src` (already holding the data).
pub fn down(ch: &mut Vec<Step>, t: &RankTree, range: &Range<usize>, chunk: usize, root_src: Buf, buf: Buf) {
    for k in 0..npieces(range.len(), chunk) {
        down_piece(ch, t, &piece(range, chunk, k), root_src, buf);
    }
}

/// Piece `c` of [`down`].
fn down_piece(ch: &mut Vec<Step>, t: &RankTree, c: &Range<usize>, root_src: Buf, buf: Buf) {
    let b: Region = reg(buf, c);
    match (t.parent, t.children.as_slice()) {
        (None, kids) => {
            for &kid in kids {
                ch.push(Step::Send { to: kid, src: reg(root_src, c) });
            }
        }
        (Some(parent), []) => ch.push(Step::Recv { from: parent, dst: b }),
        (Some(parent), kids) => {
            ch.push(Step::RecvCopySend { from: parent, to: kids[0], dst: b });
            for &kid in &kids[1..] {
                ch.push(Step::Send { to: kid, src: b });
            }
        }
    }
}

/// All-reduce of `src` into `out` over `range` on one tree, up and down
/// at once (NCCL's tree): the root reduces each piece and sends it
/// straight back down in the same step, and every other node takes piece
/// `k - 1` down right after sending piece `k` up. A link then carries at
/// most two pieces each way, which half a connection's slots hold.
pub fn up_down(ch: &mut Vec<Step>, t: &RankTree, range: &Range<usize>, chunk: usize, src: Buf, out: Buf) {
    let n = npieces(range.len(), chunk);
    for k in 0..=n {
        let c = piece(range, chunk, k);
        match t.parent {
            None if k < n => root_piece(ch, &t.children, &c, src, out),
            None => {}
            Some(_) => {
                if k < n {
                    up_piece(ch, t, &c, src, out);
                }
                if k > 0 {
                    down_piece(ch, t, &piece(range, chunk, k - 1), out, out);
                }
            }
        }
    }
}

/// The root's step of [`up_down`] for piece `c`: reduce what its children
/// send, keep it and send it back to them.
fn root_piece(ch: &mut Vec<Step>, kids: &[usize], c: &Range<usize>, src: Buf, out: Buf) {
    let (s, o) = (reg(src, c), reg(out, c));
    match kids {
        [] => ch.push(Step::Copy { src: s, dst: o }),
        &[k0] => ch.push(Step::RecvReduceCopySend { from: k0, to: k0, src: s, dst: o }),
        &[k0, ref middle @ .., last] => {
            ch.push(Step::RecvReduce { from: k0, src: s, dst: o });
            for &kid in middle {
                ch.push(Step::RecvReduce { from: kid, src: o, dst: o });
            }
            ch.push(Step::RecvReduceCopySend { from: last, to: k0, src: o, dst: o });
            for &kid in middle.iter().chain([&last]) {
                ch.push(Step::Send { to: kid, src: o });
            }
        }
    }
}

/// Hosts as a tree over them sees them: `len(h)` ranks on host `h` of
/// `hosts`, the `l`-th of which is `at(h, l)`; host 0 holds the root.
struct HostView<L, A> {
    hosts: usize,
    len: L,
    at: A,
}

impl<L: Fn(usize) -> usize, A: Fn(usize, usize) -> usize> HostView<L, A> {
    /// Our node, the `l`-th rank of host `h`, in the tree over hosts with a
    /// chain inside each, headed by its first rank.
    fn tree(&self, (h, l): (usize, usize)) -> RankTree {
        let next = (l + 1 < (self.len)(h)).then(|| (self.at)(h, l + 1));
        if l > 0 {
            return RankTree { parent: Some((self.at)(h, l - 1)), children: next.into_iter().collect() };
        }
        let node = node(self.hosts, h);
        let mut children: Vec<usize> = next.into_iter().collect();
        children.extend(node.children.iter().map(|&c| (self.at)(c, 0)));
        RankTree { parent: node.parent.map(|ph| (self.at)(ph, 0)), children }
    }
}

/// The second tree's relabelling of `n` positions: its position `i` is
/// the first tree's `second(n, i)`.
fn second(n: usize, i: usize) -> usize {
    if n.is_multiple_of(2) {
        n - 1 - i
    } else {
        (i + 1) % n
    }
}

/// The position of the second tree that holds the first tree's `j`.
fn second_inv(n: usize, j: usize) -> usize {
    if n.is_multiple_of(2) {
        n - 1 - j
    } else {
        (j + n - 1) % n
    }
}

/// The two trees of the double tree of channel `c`: over ranks on one
/// host, over hosts (chains inside) on several, each chain rotated by `c`
/// so that every channel's trees cross between hosts at other ranks, and
/// so through other NICs (as its ring does, [`Hosts::channel_ring`]).
///
/// [`Hosts::channel_ring`]: crate::topo::Hosts::channel_ring
fn double_tree(p: &Params, c: usize) -> [RankTree; 2] {
    let groups = p.hosts.groups();
    let (h, l) = (p.hosts.host_of(p.rank), p.hosts.local(p.rank));
    if groups.len() < 2 {
        let (order, n, pos) = (p.hosts.ring(), p.hosts.nranks(), p.hosts.ring_pos(p.rank));
        return [tree_at(n, |i| order[i], pos), tree_at(n, |i| order[second(n, i)], second_inv(n, pos))];
    }
    let nh = groups.len();
    // chain place `x` of host `h` holds local rank `(x + c) % len`
    let turn = |len: usize, x: usize| (x + c) % len;
    let first = HostView { hosts: nh, len: |h: usize| groups[h].len(), at: |h: usize, x: usize| groups[h][turn(groups[h].len(), x)] };
    // hosts relabelled, every chain reversed
    let g = |i: usize| &groups[second(nh, i)];
    let reversed = HostView {
        hosts: nh,
        len: |i: usize| g(i).len(),
        at: |i: usize, x: usize| g(i)[turn(g(i).len(), g(i).len() - 1 - x)],
    };
    let len = groups[h].len();
    let (x, y) = ((l + len - c % len) % len, (len - 1 + c % len + len - l) % len);
    [first.tree((h, x)), reversed.tree((second_inv(nh, h), y))]
}

/// All-reduce by double binary tree: each channel's range is halved, one
/// half reduced and broadcast on each tree, the trees on separate channels.
pub fn all_reduce(p: &Params) -> Schedule {
    let mut channels = Vec::new();
    for (c, range) in split(0..p.count, p.channels).into_iter().enumerate() {
        let trees = double_tree(p, c);
        for (half, t) in split(range, 2).iter().zip(&trees) {
            let mut ch = Vec::new();
            up_down(&mut ch, t, half, p.chunk, Buf::Input, Buf::Output);
            channels.push(ch);
        }
    }
    Schedule { channels, scratch: 0 }
}

/// The tree of a rooted collective: over ranks from the root on one host;
/// over hosts from the root's, with the root heading its host's chain, on
/// several.
fn rooted_tree(p: &Params) -> RankTree {
    let groups = p.hosts.groups();
    if groups.len() < 2 {
        let (ring, n) = (p.hosts.ring(), p.hosts.nranks());
        let (rpos, pos) = (p.hosts.ring_pos(p.root), p.hosts.ring_pos(p.rank));
        return tree_at(n, |i| ring[(rpos + i) % n], (pos + n - rpos) % n);
    }
    // hosts from the root's, the root first on its own
    let (nh, rh, rl) = (groups.len(), p.hosts.host_of(p.root), p.hosts.local(p.root));
    let g = |i: usize| &groups[(i + rh) % nh];
    let view = HostView {
        hosts: nh,
        len: |i: usize| g(i).len(),
        at: |i: usize, l: usize| if i == 0 { g(0)[(l + rl) % g(0).len()] } else { g(i)[l] },
    };
    let (h, l) = ((p.hosts.host_of(p.rank) + nh - rh) % nh, p.hosts.local(p.rank));
    view.tree((h, if h == 0 { (l + g(0).len() - rl) % g(0).len() } else { l }))
}

/// Broadcast down a tree rooted at the root.
pub fn broadcast(p: &Params) -> Schedule {
    let t = rooted_tree(p);
    let channels = split(0..p.count, p.channels)
        .iter()
        .map(|range| {
            let mut ch = Vec::new();
            if t.parent.is_none() {
                ch.push(Step::Copy { src: reg(Buf::Input, range), dst: reg(Buf::Output, range) });
            }
            down(&mut ch, &t, range, p.chunk, Buf::Input, Buf::Output);
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// Reduce up a tree rooted at the root; inner non-root nodes accumulate in
/// scratch.
pub fn reduce(p: &Params) -> Schedule {
    let t = rooted_tree(p);
    let acc = if t.parent.is_none() { Buf::Output } else { Buf::Scratch };
    let channels = split(0..p.count, p.channels)
        .iter()
        .map(|range| {
            let mut ch = Vec::new();
            up(&mut ch, &t, range, p.chunk, Buf::Input, acc);
            ch
        })
        .collect();
    let scratch = if acc == Buf::Scratch { p.count } else { 0 };
    Schedule { channels, scratch }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-order binary tree over positions `0..n`, rooted at 0, node by
    /// node as the module's notes build it.
    fn btree(n: usize) -> Vec<Node> {
        let mut nodes = vec![Node::default(); n];
        if n < 2 {
            return nodes;
        }
        let top = 1usize << (usize::BITS - 1 - (n - 1).leading_zeros());
        let mut link = |parent: usize, child: usize| {
            nodes[parent].children.push(child);
            nodes[child].parent = Some(parent);
        };
        link(0, top);
        for i in 1..n {
            let half = (i & i.wrapping_neg()) / 2;
            if half == 0 {
                continue;
            }
            link(i, i - half);
            let mut h = half;
            while h > 0 && i + h >= n {
                h /= 2;
            }
            if h > 0 {
                link(i, i + h);
            }
        }
        nodes
    }

    #[test]
    fn every_position_has_one_parent_and_depth_is_logarithmic() {
        for n in 1..=1024usize {
            let t = btree(n);
            let mut parents = vec![0usize; n];
            for (i, node) in t.iter().enumerate() {
                assert!(node.children.len() <= 2);
                for &c in &node.children {
                    parents[c] += 1;
                    assert_eq!(t[c].parent, Some(i));
                }
            }
            assert_eq!(parents[0], 0);
            assert!(parents[1..].iter().all(|&p| p == 1), "n={n}");
            let depth = (0..n)
                .map(|mut i| {
                    let mut d = 0;
                    while let Some(p) = t[i].parent {
                        i = p;
                        d += 1;
                    }
                    d
                })
                .max()
                .unwrap_or(0);
            assert!(depth <= 2 + (n as f64).log2().ceil() as usize, "n={n} depth={depth}");
        }
    }

    #[test]
    fn one_node_is_found_as_the_whole_tree_has_it() {
        for n in 1..=1024usize {
            let t = btree(n);
            for (i, want) in t.iter().enumerate() {
                assert_eq!(&node(n, i), want, "n={n} i={i}");
            }
        }
    }

    /// The trees as first written, over materialised (relabelled, rotated)
    /// groups of ranks.
    fn host_tree_by_groups(groups: &[Vec<usize>], me: usize) -> (Option<usize>, Vec<usize>) {
        let nodes = btree(groups.len());
        let (h, l) = groups
            .iter()
            .enumerate()
            .find_map(|(h, g)| g.iter().position(|&r| r == me).map(|l| (h, l)))
            .expect("a member");
        let g = &groups[h];
        let next = g.get(l + 1).copied();
        if l > 0 {
            return (Some(g[l - 1]), next.into_iter().collect());
        }
        let mut children: Vec<usize> = next.into_iter().collect();
        children.extend(nodes[h].children.iter().map(|&c| groups[c][0]));
        (nodes[h].parent.map(|ph| groups[ph][0]), children)
    }

    fn rank_tree_by_order(order: &[usize], me: usize) -> (Option<usize>, Vec<usize>) {
        let nodes = btree(order.len());
        let node = &nodes[order.iter().position(|&r| r == me).expect("a member")];
        (node.parent.map(|p| order[p]), node.children.iter().map(|&c| order[c]).collect())
    }

    fn second_order<T: Clone>(order: &[T]) -> Vec<T> {
        (0..order.len()).map(|i| order[second(order.len(), i)].clone()).collect()
    }

    #[test]
    fn trees_found_rank_by_rank_are_the_trees_over_the_whole_groups() {
        use crate::topo::Hosts;
        let shapes = (1..=64usize).map(|n| vec![n]).chain(
            [vec![2, 2, 2, 2], vec![3, 1, 2], vec![1; 7], vec![4; 5], vec![8; 8], vec![1, 5, 2, 3, 3]],
        );
        let mine = |t: RankTree| (t.parent, t.children);
        for sizes in shapes {
            let hosts = Hosts::blocks(&sizes);
            let n = hosts.nranks();
            let groups = hosts.groups().to_vec();
            for rank in 0..n {
                for root in [0, n / 2, n - 1] {
                    let p = Params { nranks: n, rank, count: 1, root, channels: 1, chunk: 1, in_place: false, around: false, hosts: &hosts, blocks: None };
                    let [a, b] = double_tree(&p, 0);
                    if groups.len() < 2 {
                        let order = hosts.ring().to_vec();
                        assert_eq!(mine(a), rank_tree_by_order(&order, rank), "{sizes:?} rank {rank}");
                        assert_eq!(mine(b), rank_tree_by_order(&second_order(&order), rank), "{sizes:?} rank {rank}");
                        let rpos = order.iter().position(|&r| r == root).expect("root");
                        let from_root: Vec<usize> = (0..n).map(|i| order[(rpos + i) % n]).collect();
                        assert_eq!(mine(rooted_tree(&p)), rank_tree_by_order(&from_root, rank), "{sizes:?} {root}");
                        continue;
                    }
                    let reversed: Vec<Vec<usize>> =
                        second_order(&groups).into_iter().map(|g| g.into_iter().rev().collect()).collect();
                    assert_eq!(mine(a), host_tree_by_groups(&groups, rank), "{sizes:?} rank {rank}");
                    assert_eq!(mine(b), host_tree_by_groups(&reversed, rank), "{sizes:?} rank {rank}");
                    let mut rotated = groups.clone();
                    rotated.rotate_left(hosts.host_of(root));
                    let at = rotated[0].iter().position(|&r| r == root).expect("root");
                    rotated[0].rotate_left(at);
                    assert_eq!(mine(rooted_tree(&p)), host_tree_by_groups(&rotated, rank), "{sizes:?} root {root}");
                }
            }
        }
    }

    /// Elements a rank sends and receives in its schedule `s`.
    fn traffic(s: &Schedule) -> (usize, usize) {
        let steps = s.channels.iter().flatten();
        let sent = steps.clone().filter(|st| st.send_peer().is_some()).map(Step::len).sum();
        (sent, steps.filter(|st| st.recv_peer().is_some()).map(Step::len).sum())
    }

    #[test]
    fn the_root_sends_each_piece_down_in_the_step_that_reduces_it() {
        use crate::topo::Hosts;
        for n in 2..=16usize {
            let hosts = Hosts::flat(n);
            let (count, chunk) = (40 * n + 3, 7);
            let mut total = (0, 0);
            for rank in 0..n {
                let p = Params { nranks: n, rank, count, root: 0, channels: 1, chunk, in_place: false, around: false, hosts: &hosts, blocks: None };
                let s = all_reduce(&p);
                let halves = split(0..count, 2);
                for ((t, ch), half) in double_tree(&p, 0).iter().zip(&s.channels).zip(&halves) {
                    if t.parent.is_some() {
                        continue;
                    }
                    // no pass of its own to send the result down: one fused step per piece
                    let fused = ch.iter().filter(|st| matches!(st, Step::RecvReduceCopySend { .. })).count();
                    assert_eq!(fused, npieces(half.len(), chunk), "n={n} rank {rank}");
                    assert!(ch.iter().all(|st| !matches!(st, Step::Send { .. })), "n={n} rank {rank}");
                }
                let (sent, recvd) = traffic(&s);
                if n == 2 {
                    // as little as a ring: each rank sends and receives the vector once
                    assert_eq!((sent, recvd), (count, count), "rank {rank}");
                }
                total = (total.0 + sent, total.1 + recvd);
            }
            // every link of both trees carries the half once up and once down
            assert_eq!(total.0, 2 * (n - 1) * count, "n={n}");
            assert_eq!(total.0, total.1);
        }
    }

    #[test]
    fn each_channel_s_trees_cross_between_hosts_at_other_ranks() {
        use crate::topo::Hosts;
        for sizes in [vec![4, 4, 4], vec![3, 2, 4, 1]] {
            let hosts = Hosts::blocks(&sizes);
            let n = hosts.nranks();
            for c in 0..5 {
                // the locals that cross, per host and tree
                let mut heads = vec![[Vec::new(), Vec::new()]; sizes.len()];
                for rank in 0..n {
                    let p = Params { nranks: n, rank, count: 1, root: 0, channels: 1, chunk: 1, in_place: false, around: false, hosts: &hosts, blocks: None };
                    for (t, tree) in double_tree(&p, c).iter().enumerate() {
                        let mut links = tree.parent.iter().chain(&tree.children);
                        if links.any(|&o| hosts.host_of(o) != hosts.host_of(rank)) {
                            heads[hosts.host_of(rank)][t].push(hosts.local(rank));
                        }
                    }
                }
                for (h, &len) in sizes.iter().enumerate() {
                    // tree one's chain starts at local c, tree two's at local c - 1
                    assert_eq!(heads[h], [vec![c % len], vec![(c + len - 1) % len]], "{sizes:?} channel {c} host {h}");
                }
            }
        }
    }

    #[test]
    fn across_hosts_only_chain_heads_cross() {
        use crate::topo::Hosts;
        for sizes in [vec![2, 2, 2, 2], vec![3, 1, 2], vec![1, 1, 1, 1, 1], vec![4, 4, 4]] {
            let hosts = Hosts::blocks(&sizes);
            let n = hosts.nranks();
            let mut heads_seen = [Vec::new(), Vec::new()];
            for rank in 0..n {
                let p =
                    Params { nranks: n, rank, count: 1, root: 0, channels: 1, chunk: 1, in_place: true, around: false, hosts: &hosts, blocks: None };
                let trees = double_tree(&p, 0);
                for (t, tree) in trees.iter().enumerate() {
                    let links = tree.parent.iter().chain(&tree.children);
                    let crossing: Vec<&usize> = links.filter(|&&o| hosts.host_of(o) != hosts.host_of(rank)).collect();
                    if !crossing.is_empty() {
                        heads_seen[t].push(rank);
                    }
                    assert!(tree.children.len() <= 3);
                }
            }
            // one rank per host crosses hosts in each tree, and not the same one (hosts of 2+)
            for seen in &heads_seen {
                let mut hs: Vec<usize> = seen.iter().map(|&r| hosts.host_of(r)).collect();
                hs.dedup();
                assert_eq!(hs.len(), seen.len(), "{sizes:?}: {seen:?}");
            }
            for (g, size) in hosts.groups().iter().zip(&sizes) {
                if *size > 1 {
                    let a = heads_seen[0].iter().find(|r| g.contains(r));
                    let b = heads_seen[1].iter().find(|r| g.contains(r));
                    assert_ne!(a, b, "{sizes:?}");
                }
            }
        }
    }
}
