//! Each rule the software provider holds to, shown broken and enforced.

use super::*;
use crate::transport::rdma::verbs::{Completion, Done, QpInfo, Remote, Sge, Status};
use std::time::Instant;

fn device(retry_ms: u64) -> SoftDevice {
    SoftDevice::open([127, 0, 0, 1].into(), Duration::from_millis(retry_ms), None).expect("device")
}

/// Two devices and a queue pair on each, connected to each other.
fn pair() -> (SoftDevice, SoftDevice, Box<dyn QueuePair>, Box<dyn QueuePair>) {
    let (da, db) = (device(2000), device(2000));
    let (mut a, mut b) = (da.queue_pair(16).expect("qp"), db.queue_pair(16).expect("qp"));
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib).expect("connect a");
    b.connect(&ia).expect("connect b");
    (da, db, a, b)
}

/// Polls `q` until it has given `n` completions (or 5 s passed).
fn wait(q: &mut Box<dyn QueuePair>, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < n && t.elapsed() < Duration::from_secs(5) {
        let left = n - got.len();
        q.poll(&mut got, left).expect("poll");
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

fn sge(mr: &Mr, off: usize, len: u32) -> Sge {
    Sge { addr: mr.addr + off, len, lkey: mr.lkey }
}

fn remote(mr: &Mr, off: usize) -> Remote {
    Remote { addr: (mr.addr + off) as u64, rkey: mr.rkey }
}

#[test]
fn writes_land_in_order_and_each_immediate_consumes_a_receive() {
    let (da, db, mut a, mut b) = pair();
    let mut src: Vec<u8> = (0..4096).map(|_| rand::random()).collect();
    let mut dst = vec![0u8; 8192];
    // SAFETY: both vectors outlive their registrations (deregistered below).
    let (ms, md) = unsafe { (da.register(src.as_mut_ptr(), 4096).expect("reg"), db.register(dst.as_mut_ptr(), 8192).expect("reg")) };
    b.post_recv(70).expect("recv");
    b.post_recv(71).expect("recv");
    // SAFETY: `src` stays registered and unchanged until the completions below.
    unsafe {
        a.post_write(1, &[sge(&ms, 0, 1000)], remote(&md, 0), None, false).expect("write");
        a.post_write(2, &[sge(&ms, 1000, 24), sge(&ms, 0, 8)], remote(&md, 4096), Some(9), true).expect("write");
        a.post_write(3, &[sge(&ms, 2048, 2048)], remote(&md, 6144), Some(10), true).expect("write");
    }
    let sent = wait(&mut a, 2);
    assert_eq!(sent.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(2, Status::Success), (3, Status::Success)]);
    let got = wait(&mut b, 2);
    assert_eq!(got[0], Completion { wr_id: 70, status: Status::Success, done: Done::Recv { imm: 9, len: 32 } });
    assert_eq!(got[1], Completion { wr_id: 71, status: Status::Success, done: Done::Recv { imm: 10, len: 2048 } });
    assert_eq!(dst[..1000], src[..1000]);
    assert_eq!(dst[4096..4120], src[1000..1024]);
    assert_eq!(dst[4120..4128], src[..8]);
    assert_eq!(dst[6144..], src[2048..]);
    let mut more = Vec::new();
    a.poll(&mut more, 8).expect("poll");
    assert!(more.is_empty(), "the unsignaled write gives no completion: {more:?}");
    da.deregister(&ms);
    db.deregister(&md);
}

#[test]
fn a_wrong_rkey_or_a_write_out_of_bounds_is_refused_and_errs_both_queue_pairs() {
    for (off, len, rkey_delta) in [(0usize, 64u32, 1u32), (4000, 200, 0)] {
        let (da, db, mut a, mut b) = pair();
        let mut src = vec![7u8; 4096];
        let mut dst = vec![0u8; 4096];
        // SAFETY: both vectors outlive their registrations.
        let (ms, md) = unsafe { (da.register(src.as_mut_ptr(), 4096).expect("reg"), db.register(dst.as_mut_ptr(), 4096).expect("reg")) };
        b.post_recv(5).expect("recv");
        let bad = Remote { addr: (md.addr + off) as u64, rkey: md.rkey.wrapping_add(rkey_delta) };
        // SAFETY: `src` stays registered until the completions.
        unsafe {
            a.post_write(1, &[sge(&ms, 0, len)], bad, None, true).expect("write");
            a.post_write(2, &[sge(&ms, 0, 8)], remote(&md, 0), None, true).expect("write");
        }
        let c = wait(&mut a, 2);
        assert_eq!((c[0].wr_id, c[0].status), (1, Status::RemoteAccess), "{c:?}");
        assert_eq!((c[1].wr_id, c[1].status), (2, Status::Flushed), "{c:?}");
        assert!(dst.iter().all(|&x| x == 0), "nothing landed");
        // the responder errs too: its posted receive is flushed
        assert_eq!(wait(&mut b, 1)[0].status, Status::Flushed);
        // and a later request on the errored queue pair is flushed at once
        // SAFETY: as above.
        unsafe { a.post_write(3, &[sge(&ms, 0, 8)], remote(&md, 0), None, true).expect("posted") };
        assert_eq!(wait(&mut a, 1)[0], Completion { wr_id: 3, status: Status::Flushed, done: Done::Write });
        da.deregister(&ms);
        db.deregister(&md);
    }
}

#[test]
fn a_local_piece_outside_its_lkey_s_region_is_a_local_protection_error() {
    let (da, db, mut a, _b) = pair();
    let mut src = vec![1u8; 256];
    let mut dst = vec![0u8; 256];
    // SAFETY: both vectors outlive their registrations.
    let (ms, md) = unsafe { (da.register(src.as_mut_ptr(), 256).expect("reg"), db.register(dst.as_mut_ptr(), 256).expect("reg")) };
    // SAFETY: the piece is refused before it is read.
    unsafe { a.post_write(1, &[sge(&ms, 200, 100)], remote(&md, 0), None, true).expect("write") };
    assert_eq!(wait(&mut a, 1)[0].status, Status::LocalProtection);
    // the other device's key names no region of this one
    let (_d1, _d2, mut a2, _b2) = pair();
    // SAFETY: as above.
    unsafe { a2.post_write(1, &[Sge { addr: md.addr, len: 8, lkey: md.lkey }], remote(&md, 0), None, true).expect("w") };
    assert_eq!(wait(&mut a2, 1)[0].status, Status::LocalProtection);
    da.deregister(&ms);
    db.deregister(&md);
}

#[test]
fn a_write_with_immediate_and_no_posted_receive_fails() {
    let (da, db, mut a, _b) = pair();
    let mut src = vec![1u8; 64];
    let mut dst = vec![0u8; 64];
    // SAFETY: both vectors outlive their registrations.
    let (ms, md) = unsafe { (da.register(src.as_mut_ptr(), 64).expect("reg"), db.register(dst.as_mut_ptr(), 64).expect("reg")) };
    // SAFETY: `src` stays registered until the completion.
    unsafe { a.post_write(1, &[sge(&ms, 0, 64)], remote(&md, 0), Some(1), true).expect("write") };
    assert_eq!(wait(&mut a, 1)[0].status, Status::ReceiverNotReady);
    da.deregister(&ms);
    db.deregister(&md);
}

#[test]
fn a_queue_pair_forced_to_error_flushes_what_is_outstanding() {
    let (da, _db, mut a, mut b) = pair();
    b.post_recv(1).expect("recv");
    b.post_recv(2).expect("recv");
    b.fail();
    let c = wait(&mut b, 2);
    assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(1, Status::Flushed), (2, Status::Flushed)]);
    b.post_recv(3).expect("posting to an errored queue pair completes it");
    assert_eq!(wait(&mut b, 1)[0].wr_id, 3);
    // its peer sees the connection go: its next write exceeds its retries
    let mut src = vec![0u8; 8];
    // SAFETY: `src` outlives its registration.
    let ms = unsafe { da.register(src.as_mut_ptr(), 8).expect("reg") };
    // SAFETY: `src` stays registered until the completion.
    unsafe { a.post_write(9, &[sge(&ms, 0, 8)], Remote { addr: 0, rkey: 0 }, None, true).expect("write") };
    assert_eq!(wait(&mut a, 1)[0].status, Status::RetryExceeded);
    da.deregister(&ms);
}

#[test]
fn a_peer_that_vanishes_or_falls_silent_gives_retry_exceeded_in_bounded_time() {
    // gone: its device and queue pair dropped
    let (da, db, mut a, b) = pair();
    let mut src = vec![3u8; 64];
    // SAFETY: `src` outlives its registration.
    let ms = unsafe { da.register(src.as_mut_ptr(), 64).expect("reg") };
    drop(b);
    drop(db);
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: `src` stays registered until the completion.
    unsafe { a.post_write(1, &[sge(&ms, 0, 64)], Remote { addr: 8, rkey: 1 }, None, true).expect("write") };
    assert_eq!(wait(&mut a, 1)[0].status, Status::RetryExceeded);
    // silent: a listener that takes the connection and never answers
    let quiet = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut fake = device(2000).queue_pair(4).expect("qp").info();
    let dq = device(300);
    let mut q = dq.queue_pair(4).expect("qp");
    let port = quiet.local_addr().expect("addr").port();
    fake.extra[16..18].copy_from_slice(&port.to_le_bytes());
    q.connect(&fake).expect("the connection opens");
    // SAFETY: a registration of `dq` that outlives the request
    let mq = unsafe { dq.register(src.as_mut_ptr(), 64).expect("reg") };
    let t = Instant::now();
    // SAFETY: as above.
    unsafe { q.post_write(1, &[sge(&mq, 0, 64)], Remote { addr: 8, rkey: 1 }, None, true).expect("write") };
    assert_eq!(wait(&mut q, 1)[0].status, Status::RetryExceeded);
    assert!(t.elapsed() >= Duration::from_millis(300), "not before the retry time");
    drop(quiet);
}

#[test]
fn a_connection_without_the_queue_pair_s_token_is_closed() {
    let (da, db) = (device(2000), device(2000));
    let (mut a, b) = (da.queue_pair(4).expect("qp"), db.queue_pair(4).expect("qp"));
    let mut forged: QpInfo = b.info();
    forged.extra[20] ^= 1;
    a.connect(&forged).expect("the connection opens");
    let mut src = vec![3u8; 64];
    // SAFETY: `src` outlives its registration.
    let ms = unsafe { da.register(src.as_mut_ptr(), 64).expect("reg") };
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: `src` stays registered until the completion.
    unsafe { a.post_write(1, &[sge(&ms, 0, 8)], Remote { addr: 0, rkey: 0 }, None, true).expect("write") };
    assert_eq!(wait(&mut a, 1)[0].status, Status::RetryExceeded, "the peer device closed it");
}

#[test]
fn the_completion_channel_becomes_readable_when_a_completion_arrives() {
    let (da, db, mut a, mut b) = pair();
    let mut src = vec![1u8; 8];
    let mut dst = vec![0u8; 8];
    // SAFETY: both vectors outlive their registrations.
    let (ms, md) = unsafe { (da.register(src.as_mut_ptr(), 8).expect("reg"), db.register(dst.as_mut_ptr(), 8).expect("reg")) };
    b.post_recv(1).expect("recv");
    b.arm().expect("arm");
    let readable = |fd| {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 2000) == 1 }
    };
    // SAFETY: `src` stays registered until the completion.
    unsafe { a.post_write(1, &[sge(&ms, 0, 8)], remote(&md, 0), Some(4), false).expect("write") };
    assert!(readable(b.fd()));
    assert_eq!(wait(&mut b, 1)[0].done, Done::Recv { imm: 4, len: 8 });
    b.arm().expect("arm");
    let mut p = libc::pollfd { fd: b.fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "armed again: quiet until the next");
    assert_eq!(dst, src);
}

#[test]
fn idle_strangers_flooding_a_device_keep_no_queue_pair_from_its_peer() {
    let (da, db) = (device(2000), device(2000));
    let idle: Vec<std::net::TcpStream> =
        (0..3 * INTRODUCING).filter_map(|_| std::net::TcpStream::connect(db.addr()).ok()).collect();
    assert!(idle.len() > INTRODUCING, "{} connected", idle.len());
    let (mut a, mut b) = (da.queue_pair(4).expect("qp"), db.queue_pair(4).expect("qp"));
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib).expect("connect a");
    b.connect(&ia).expect("connect b");
    let mut src = vec![9u8; 64];
    let mut dst = vec![0u8; 64];
    // SAFETY: both vectors outlive their registrations.
    let (ms, md) = unsafe { (da.register(src.as_mut_ptr(), 64).expect("reg"), db.register(dst.as_mut_ptr(), 64).expect("reg")) };
    b.post_recv(1).expect("recv");
    // SAFETY: `src` stays registered until the completion.
    unsafe { a.post_write(1, &[sge(&ms, 0, 64)], remote(&md, 0), Some(3), true).expect("write") };
    assert_eq!(wait(&mut a, 1)[0].status, Status::Success);
    assert_eq!(wait(&mut b, 1)[0].done, Done::Recv { imm: 3, len: 64 });
    assert_eq!(dst, src);
    drop(idle);
    da.deregister(&ms);
    db.deregister(&md);
}

#[test]
fn strangers_churning_connections_to_a_device_keep_no_queue_pair_from_its_peer() {
    let (da, db) = (device(2000), device(2000));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn: Vec<_> = (0..2)
        .map(|_| {
            let (stop, at) = (std::sync::Arc::clone(&stop), db.addr());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += u64::from(std::net::TcpStream::connect(at).is_ok());
                }
                n
            })
        })
        .collect();
    for round in 0..8u8 {
        let (mut a, mut b) = (da.queue_pair(4).expect("qp"), db.queue_pair(4).expect("qp"));
        let (ia, ib) = (a.info(), b.info());
        a.connect(&ib).expect("connect a");
        b.connect(&ia).expect("connect b");
        let mut src = vec![round; 64];
        let mut dst = vec![0u8; 64];
        // SAFETY: both vectors outlive their registrations.
        let (ms, md) = unsafe { (da.register(src.as_mut_ptr(), 64).expect("reg"), db.register(dst.as_mut_ptr(), 64).expect("reg")) };
        b.post_recv(1).expect("recv");
        // SAFETY: `src` stays registered until the completion.
        unsafe { a.post_write(1, &[sge(&ms, 0, 64)], remote(&md, 0), Some(3), true).expect("write") };
        assert_eq!(wait(&mut a, 1)[0].status, Status::Success, "round {round}");
        assert_eq!(wait(&mut b, 1)[0].done, Done::Recv { imm: 3, len: 64 });
        assert_eq!(dst, src);
        da.deregister(&ms);
        db.deregister(&md);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened: u64 = churn.into_iter().map(|t| t.join().expect("churner")).sum();
    assert!(opened > INTRODUCING as u64, "only {opened} churned");
}
