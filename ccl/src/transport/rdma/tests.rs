//! The transport over the software provider, two endpoints in one
//! process: messages, the protocol's economy, and its faults.

use super::*;
use crate::transport::{RecvVerbs, SendVerbs};
use std::time::Instant;

/// Endpoint 0's and 1's RDMA transports, each over a soft device and
/// meeting over TCP on loopback.
fn pair() -> (Rdma, Rdma) {
    let l1 = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
    let at1 = l1.local_addr().expect("addr");
    let l0 = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
    let at0 = l0.local_addr().expect("addr");
    let hosts: Arc<[String]> = Arc::from(["h0".to_string(), "h1".to_string()]);
    let ends = [(0, l0), (1, l1)].map(|(me, l)| {
        let tcp = Arc::new(Tcp::new(me, [3; 16], l, vec![at0, at1], 1, false));
        let dev: Arc<dyn Device> =
            Arc::new(soft::SoftDevice::open([127, 0, 0, 1].into(), Duration::from_secs(2), None).expect("device"));
        let ports = vec![Some(LinkLayer::Ethernet); 2];
        Rdma::new(me, vec![dev], tcp, Arc::clone(&hosts), ports, false).expect("rdma")
    });
    let [a, b] = ends;
    (a, b)
}

fn conns(ring: Geometry) -> (Rdma, Rdma, SendConn, RecvConn) {
    conns_over(ring, 1)
}

/// A connection of `k` queue pairs.
fn conns_over(ring: Geometry, k: usize) -> (Rdma, Rdma, SendConn, RecvConn) {
    let (a, b) = pair();
    let (a, b) = (a.queue_pairs(k), b.queue_pairs(k));
    let key = ConnKey { comm: 5, from: 0, to: 1, channel: 0 };
    let s = a.connect_send(key, ring).expect("send");
    let r = b.connect_recv(key, ring).expect("recv");
    (a, b, s, r)
}

/// Sends `n` messages of `len` bytes (message `i` filled with `i`),
/// checking each on arrival, the sender `ahead` messages before the
/// receiver frees them at most.
fn stream(s: &mut SendConn, r: &mut RecvConn, n: usize, len: usize) -> Result<()> {
    let (mut sent, mut got) = (0, 0);
    let t = Instant::now();
    while got < n {
        if t.elapsed() > Duration::from_secs(30) {
            return Err(Error::transport(format!("stalled at {sent} sent, {got} arrived")));
        }
        if sent < n {
            if let Some(p) = s.reserve(len, false)? {
                // SAFETY: a reserved slot of at least `len` bytes.
                unsafe { std::ptr::write_bytes(p, sent as u8, len) };
                s.post(len, &[sent as u64, 1, 2, 3]);
                sent += 1;
            }
        }
        s.flush()?;
        if let Some((p, l, fp)) = r.peek()? {
            // SAFETY: a peeked message of `l` bytes, ours until released.
            let m = unsafe { std::slice::from_raw_parts(p, l) };
            assert_eq!((l, fp), (len, [got as u64, 1, 2, 3]), "message {got}");
            assert!(m.iter().all(|&x| x == got as u8), "message {got}'s bytes");
            r.release();
            got += 1;
        }
    }
    Ok(())
}

#[test]
fn messages_arrive_whole_in_order_with_their_fingerprints() {
    let (_a, _b, mut s, mut r) = conns(Geometry { nslots: 2, slot_bytes: 4096 });
    assert_eq!((s.slot_bytes(), r.slot_bytes()), (4096, 4096));
    assert!(s.offers().pollable && s.offers().staged && s.offers().lends);
    stream(&mut s, &mut r, 100, 4096).expect("full slots");
    stream(&mut s, &mut r, 50, 1).expect("one byte");
    stream(&mut s, &mut r, 10, 0).expect("empty messages");
}

/// Receives `n` messages and returns each one's bytes and fingerprint's first word.
fn drain(s: &mut SendConn, r: &mut RecvConn, n: usize) -> Vec<(Vec<u8>, u64)> {
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < n && t.elapsed() < Duration::from_secs(30) {
        s.flush().expect("flush");
        if let Some((p, l, fp)) = r.peek().expect("peek") {
            // SAFETY: a peeked message of `l` bytes, ours until released.
            got.push((unsafe { std::slice::from_raw_parts(p, l) }.to_vec(), fp[0]));
            r.release();
        }
    }
    got
}

#[test]
fn messages_lent_from_registered_memory_go_from_there_and_the_rest_are_copied() {
    let (a, _b, mut s, mut r) = conns(Geometry { nslots: 8, slot_bytes: 4096 });
    let mut mem: Vec<u8> = (0..4 * 4096).map(|_| rand::random()).collect();
    let other: Vec<u8> = (0..4096).map(|_| rand::random()).collect();
    let want: Vec<Vec<u8>> = mem.chunks(4096).map(<[u8]>::to_vec).chain([other.clone()]).collect();
    // SAFETY: `mem` outlives the registration, dropped at the end.
    let span = unsafe { a.register(mem.as_mut_ptr(), mem.len()) }.expect("register").expect("a span");
    for (i, m) in mem.chunks(4096).enumerate() {
        s.reserve(4096, false).expect("reserve").expect("a free slot");
        // SAFETY: `mem` stays unchanged until `lent` is 0 below.
        unsafe { s.lend(m.as_ptr(), m.len(), &[i as u64, 0, 0, 0], false) }.expect("lend");
        assert_eq!(s.lent(), i + 1, "message {i} is written from registered memory");
    }
    s.reserve(4096, false).expect("reserve").expect("a free slot");
    // SAFETY: `other` is valid; unregistered, it is copied at once.
    unsafe { s.lend(other.as_ptr(), other.len(), &[4, 0, 0, 0], false) }.expect("lend");
    assert_eq!(s.lent(), 4, "unregistered memory is copied into its slot");
    let got = drain(&mut s, &mut r, 5);
    assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!(got.iter().zip(&want).all(|(g, w)| &g.0 == w), "every message's bytes");
    let t = Instant::now();
    while s.lent() > 0 && t.elapsed() < Duration::from_secs(10) {
        s.flush().expect("flush");
    }
    assert_eq!(s.lent(), 0, "every lent write completed");
    drop(span);
}

#[test]
fn channels_spread_over_the_ports_and_lend_from_their_own_registration() {
    // each endpoint with two soft devices (on two loopback addresses):
    // channel c on device c mod 2, each carrying its messages, each
    // writing from the caller's registered memory through its own device
    let l1 = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
    let at1 = l1.local_addr().expect("addr");
    let l0 = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
    let at0 = l0.local_addr().expect("addr");
    let hosts: Arc<[String]> = Arc::from(["h0".to_string(), "h1".to_string()]);
    let [a, b] = [(0, l0), (1, l1)].map(|(me, l)| {
        let tcp = Arc::new(Tcp::new(me, [3; 16], l, vec![at0, at1], 1, false));
        let dev = |ip: [u8; 4]| {
            Arc::new(soft::SoftDevice::open(ip.into(), Duration::from_secs(2), None).expect("device")) as Arc<dyn Device>
        };
        let devs = vec![dev([127, 0, 0, 1]), dev([127, 0, 0, 2])];
        Rdma::new(me, devs, tcp, Arc::clone(&hosts), vec![Some(LinkLayer::Ethernet); 2], false).expect("rdma")
    });
    let names: Vec<String> = a.shared.ports.iter().map(|p| p.name.clone()).collect();
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1], "two devices");
    let mut mem: Vec<u8> = (0..2 * 4096).map(|_| rand::random()).collect();
    // SAFETY: `mem` outlives the registration, dropped at the end.
    let span = unsafe { a.register(mem.as_mut_ptr(), mem.len()) }.expect("register").expect("spans");
    let ring = Geometry { nslots: 4, slot_bytes: 4096 };
    for channel in 0..4u32 {
        assert_eq!(a.link(1, channel).dev_name(), names[channel as usize % 2], "channel {channel}");
        let key = ConnKey { comm: 6, from: 0, to: 1, channel };
        let (mut s, mut r) = (a.connect_send(key, ring).expect("send"), b.connect_recv(key, ring).expect("recv"));
        for (i, m) in mem.chunks(4096).enumerate() {
            s.reserve(4096, false).expect("reserve").expect("a free slot");
            // SAFETY: `mem` stays unchanged until `lent` is 0 below.
            unsafe { s.lend(m.as_ptr(), m.len(), &[i as u64, 0, 0, 0], false) }.expect("lend");
        }
        assert_eq!(s.lent(), 2, "channel {channel} writes from registered memory");
        let got = drain(&mut s, &mut r, 2);
        assert!(got.iter().zip(mem.chunks(4096)).all(|(g, w)| g.0 == w), "channel {channel}'s bytes");
        let t = Instant::now();
        while s.lent() > 0 && t.elapsed() < Duration::from_secs(10) {
            s.flush().expect("flush");
        }
        assert_eq!(s.lent(), 0, "channel {channel}: every lent write completed");
        stream(&mut s, &mut r, 20, 3000).unwrap_or_else(|e| panic!("channel {channel}: {e}"));
    }
    drop(span);
}

#[test]
fn a_lent_message_taken_back_or_forgotten_leaves_its_memory_free_to_change() {
    let (a, _b, mut s, mut r) = conns(Geometry { nslots: 8, slot_bytes: 4096 });
    let mut mem = vec![7u8; 2 * 4096];
    // SAFETY: `mem` outlives the registration, dropped at the end.
    let span = unsafe { a.register(mem.as_mut_ptr(), mem.len()) }.expect("register");
    for (i, m) in mem.chunks(4096).enumerate() {
        s.reserve(4096, true).expect("reserve").expect("a free slot");
        // SAFETY: `mem` stays unchanged until taken back or forgotten below.
        unsafe { s.lend(m.as_ptr(), m.len(), &[i as u64, 0, 0, 0], true) }.expect("lend");
    }
    s.reclaim(mem.as_ptr(), 10);
    assert_eq!(s.lent(), 1, "the first message taken back");
    s.forget_lent();
    assert_eq!(s.lent(), 0, "the second forgotten");
    mem.fill(9);
    let got = drain(&mut s, &mut r, 2);
    assert!(got.iter().all(|(m, _)| m.len() == 4096 && m.iter().all(|&x| x == 7)), "what was lent arrives");
    drop(span);
}

#[test]
fn one_write_per_slot_and_credits_come_back_in_batches() {
    let slot = 512 << 10;
    let (_a, _b, mut s, mut r) = conns(Geometry { nslots: 2, slot_bytes: slot });
    let n = (64 << 20) / slot;
    stream(&mut s, &mut r, n, slot).expect("64 MiB");
    let (SendConn::Rdma(s), RecvConn::Rdma(r)) = (&s, &r) else { panic!("rdma ends") };
    assert_eq!(s.writes(), n as u64, "one write with immediate per slot");
    assert!(r.credit_writes() < n as u64, "{} credit writes for {n} slots", r.credit_writes());
}

#[test]
fn a_queue_pair_forced_to_error_fails_its_end_naming_the_peer_and_the_other_end_sees_it_go() {
    let (_a, _b, mut s, mut r) = conns(Geometry { nslots: 2, slot_bytes: 1024 });
    stream(&mut s, &mut r, 4, 64).expect("connected");
    let SendConn::Rdma(rs) = &mut s else { panic!("rdma") };
    rs.fail_queue_pair();
    let e = stream(&mut s, &mut r, 4, 64).expect_err("errored");
    assert_eq!(e.context().peer, Some(1), "{e}");
    assert!(e.to_string().contains("flushed"), "{e}");
    drop(s);
    let t = Instant::now();
    let e = loop {
        match r.peek() {
            Err(e) => break e,
            Ok(_) if t.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(5)),
            Ok(_) => panic!("the receiver never saw its sender go"),
        }
    };
    assert_eq!(e.context().peer, Some(0), "{e}");
    assert!(matches!(e.kind(), ErrorKind::PeerLost { rank: 0, .. }), "{e}");
}

#[test]
fn a_corrupted_rkey_fails_both_ends_naming_each_other() {
    let (_a, _b, mut s, mut r) = conns(Geometry { nslots: 2, slot_bytes: 1024 });
    stream(&mut s, &mut r, 4, 64).expect("connected");
    let SendConn::Rdma(rs) = &mut s else { panic!("rdma") };
    rs.corrupt_rkey();
    let t = Instant::now();
    let e = loop {
        let step = s.reserve(64, false).map(|p| p.map(|_| s.post(64, &[0; 4]))).and_then(|_| s.flush());
        match step {
            Err(e) => break e,
            Ok(()) if t.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(1)),
            Ok(()) => panic!("the write was never refused"),
        }
    };
    assert!(e.to_string().contains("remote access error"), "{e}");
    assert_eq!(e.context().peer, Some(1), "{e}");
    let t = Instant::now();
    let er = loop {
        match r.peek() {
            Err(e) => break e,
            Ok(_) if t.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(5)),
            Ok(_) => panic!("the receiver never erred"),
        }
    };
    assert_eq!(er.context().peer, Some(0), "{er}");
}

#[test]
fn ranks_without_a_port_or_with_another_link_layer_are_left_to_tcp() {
    let l = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
    let at = l.local_addr().expect("addr");
    let tcp = Arc::new(Tcp::new(0, [3; 16], l, vec![at; 4], 1, false));
    let dev: Arc<dyn Device> =
        Arc::new(soft::SoftDevice::open([127, 0, 0, 1].into(), Duration::from_secs(2), None).expect("device"));
    let hosts: Arc<[String]> = (0..4).map(|h| format!("h{h}")).collect();
    let ports = vec![Some(LinkLayer::Ethernet), None, Some(LinkLayer::Infiniband), Some(LinkLayer::Ethernet)];
    let r = Rdma::new(0, vec![dev], tcp, hosts, ports, false).expect("rdma");
    assert!(r.can_connect(0, 3) && r.can_connect(3, 0));
    assert!(!r.can_connect(0, 1) && !r.can_connect(1, 0), "no port there");
    assert!(!r.can_connect(0, 2), "InfiniBand and RoCE do not meet");
}

#[test]
fn several_queue_pairs_carry_a_connection_in_turn_and_messages_come_out_in_order() {
    for k in [2, 3] {
        let (_a, _b, mut s, mut r) = conns_over(Geometry { nslots: 2, slot_bytes: 4096 }, k);
        stream(&mut s, &mut r, 200, 4096).expect("full slots");
        stream(&mut s, &mut r, 31, 7).expect("small ones");
    }
    let slot = 512 << 10;
    let (_a, _b, mut s, mut r) = conns_over(Geometry { nslots: 2, slot_bytes: slot }, 4);
    let n = (64 << 20) / slot;
    stream(&mut s, &mut r, n, slot).expect("64 MiB over 4");
    let (SendConn::Rdma(s), RecvConn::Rdma(r)) = (&s, &r) else { panic!("rdma ends") };
    assert_eq!(s.writes(), n as u64);
    assert!(r.credit_writes() < n as u64, "{} credit writes for {n} slots", r.credit_writes());
}
