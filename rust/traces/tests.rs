use super::log::{self, Log};
use super::{pickle, prepare, rmm, snapshot};

/// A protocol-2 pickle of `{"segments": [], "device_traces": [[entry]]}` written by hand.
fn tiny_snapshot(entry: &[u8]) -> Vec<u8> {
    let mut v = vec![0x80, 2, b'}', b'(', 0x8c];
    for (k, body) in [(&b"segments"[..], &b"]"[..]), (b"device_traces", b"]]")] {
        if k != b"segments" {
            v.push(0x8c);
        }
        v.push(k.len() as u8);
        v.extend_from_slice(k);
        v.extend_from_slice(body);
        if k != b"segments" {
            v.extend_from_slice(entry);
            v.extend_from_slice(b"aa");
        }
    }
    v.extend_from_slice(b"u.");
    v
}

fn s(k: &str) -> Vec<u8> {
    let mut v = vec![0x8c, k.len() as u8];
    v.extend_from_slice(k.as_bytes());
    v
}

#[test]
fn reads_an_entry_into_a_row() {
    let mut e = vec![b'}', b'('];
    for (k, val) in [
        ("action", s("alloc")),
        ("addr", vec![b'J', 0, 16, 0, 0]),
        ("size", vec![b'K', 64]),
    ] {
        e.extend(s(k));
        e.extend(val);
    }
    e.push(b'u');
    let data = tiny_snapshot(&e);
    let l = pickle::load(&data, true).unwrap();
    assert_eq!(l.entries.len(), 1);
    let t = snapshot::read_device(&l, "x", 0).unwrap();
    assert_eq!(t.log.action, vec![log::ALLOC]);
    assert_eq!(t.log.ptr, vec![4096]);
    assert_eq!(t.log.size, vec![64]);
    assert!(t.has_history);
}

#[test]
fn refuses_globals_and_calls_naming_them() {
    let e = pickle::load(b"\x80\x02cos\nsystem\nq\x00.", false)
        .err()
        .unwrap();
    assert!(
        e.0.contains("os.system") && e.0.contains("GLOBAL"),
        "{}",
        e.0
    );
    let e = pickle::load(b"\x80\x04\x8c\x02os\x8c\x06system\x93.", false)
        .err()
        .unwrap();
    assert!(
        e.0.contains("os.system") && e.0.contains("STACK_GLOBAL"),
        "{}",
        e.0
    );
    for op in [b'R', b'b', 0x81, b'o'] {
        let e = pickle::load(&[0x80, 2, b')', op, b'.'], false)
            .err()
            .unwrap();
        assert!(e.0.starts_with("refused"), "{}", e.0);
    }
}

#[test]
fn refuses_lengths_past_the_end_and_memo_bombs() {
    // BYTEARRAY8 of 7.4 GB in a few bytes
    let e = pickle::load(b"\x80\x05\x96\x00\x00\x00\xc0\x01\x00\x00\x00.", false)
        .err()
        .unwrap();
    assert!(e.0.contains("past the end"), "{}", e.0);
    // LONG_BINPUT 680811924
    let e = pickle::load(b"\x80\x02N\x72\x94\x94\x94\x28.", false)
        .err()
        .unwrap();
    assert!(e.0.contains("memo index"), "{}", e.0);
    assert!(
        pickle::load(b"\x80\x02]q\x00h\x00a.", false).is_err(),
        "a list that holds itself"
    );
}

#[test]
fn no_input_panics() {
    // every prefix and every one-byte change of a small snapshot: an error or a value, never a panic
    let mut e = vec![b'}', b'('];
    e.extend(s("action"));
    e.extend(s("oom"));
    e.extend(s("size"));
    e.extend([b'K', 9]);
    e.push(b'u');
    let data = tiny_snapshot(&e);
    for n in 0..data.len() {
        let _ = pickle::load(&data[..n], true);
        for b in [0u8, 0x28, 0x80, 0xff, b'e', b'u', b'a', b'.', 0x94, b'h'] {
            let mut d = data.clone();
            d[n] = b;
            if let Ok(l) = pickle::load(&d, true) {
                for dev in snapshot::devices(&l) {
                    let _ = snapshot::read_device(&l, "x", dev);
                }
            }
        }
    }
}

#[test]
fn rmm_rows_in_every_variant() {
    let text = b"Thread,Time,Action,Pointer,Size,Stream\n\
        1,00:00:01.5,allocate,0x1000,64,0x0\n\
        2,1700000000.25,allocate,8192,32,7\n\
        1,2,allocate failure,(nil),1000000,0\n\
        2,00:00:02,free,0x1000,64,0x0\n";
    let l = rmm::read(&text[..], "x", 0).unwrap();
    assert_eq!(
        l.action,
        vec![log::ALLOC, log::ALLOC, log::ALLOC_FAILED, log::FREE]
    );
    assert_eq!(l.ptr, vec![0x1000, 8192, 0, 0x1000]);
    assert_eq!(
        l.time_us,
        vec![1_500_000, 1_700_000_000_250_000, 2_000_000, 2_000_000]
    );
    assert_eq!(l.thread, vec![1, 2, 1, 2]);
    assert_eq!(l.stream[1], 7);
    let bad = b"Thread,Time,Action,Pointer,Size,Stream\n1,x,allocate,0x1,1,0\n";
    assert!(rmm::read(&bad[..], "x", 0).is_err());
}

#[test]
fn a_log_whose_pointers_have_no_0x_is_hex_throughout() {
    // RMM's logger on rapids-logger writes pointers and streams with printf's `%llx`: hex, no
    // `0x`. A pointer that happens to have no letter a-f is hex too, or "1000" (0x1000) would
    // read as 1000, the pointer written "3e8".
    let text = b"Thread,Time,Action,Pointer,Size,Stream\n\
        1,10:00:00.000001,allocate,1000,64,0\n\
        1,10:00:00.000002,allocate,3e8,64,7f00a0\n\
        1,10:00:00.000003,allocate failure,0,1000000,0\n\
        1,10:00:00.000004,free,1000,64,0\n\
        1,10:00:00.000005,allocate,302000000,64,10\n";
    let l = rmm::read(&text[..], "x", 0).unwrap();
    assert_eq!(l.ptr, vec![0x1000, 0x3e8, 0, 0x1000, 0x3_0200_0000]);
    assert_eq!(l.stream, vec![0, 0x7f_00a0, 0, 0, 0x10]);
    // with `0x` anywhere in a column (fmt's `{}` of a pointer), digits alone stay decimal
    let text = b"Thread,Time,Action,Pointer,Size,Stream\n\
        1,1,allocate,0x3e8,64,0x0\n\
        1,2,allocate,1000,64,0x0\n";
    assert_eq!(rmm::read(&text[..], "x", 0).unwrap().ptr, vec![0x3e8, 1000]);
}

#[test]
fn a_log_that_runs_past_midnight_keeps_its_time_running_on() {
    // RMM's logger writes the time of day: after 23:59:59 comes 00:00:00 of the next day
    let text = b"Thread,Time,Action,Pointer,Size,Stream\n\
        1,23:59:59.999000,allocate,0x1000,64,0x0\n\
        1,00:00:00.000100,free,0x1000,64,0x0\n\
        1,23:59:59.000000,allocate,0x2000,64,0x0\n\
        1,00:00:01.000000,free,0x2000,64,0x0\n";
    let l = rmm::read(&text[..], "x", 0).unwrap();
    let day = 86_400_000_000i64;
    assert_eq!(
        l.time_us,
        vec![
            day - 1_000,
            day + 100,
            2 * day - 1_000_000,
            2 * day + 1_000_000
        ]
    );
    // threads' rows a little out of order are not a new day
    let text = b"Thread,Time,Action,Pointer,Size,Stream\n\
        1,10:00:00.000200,allocate,0x1000,64,0x0\n\
        2,10:00:00.000100,allocate,0x2000,64,0x0\n";
    assert_eq!(
        rmm::read(&text[..], "x", 0).unwrap().time_us[1],
        36_000_000_100
    );
}

#[test]
fn prepare_maps_pointers_to_ids() {
    let mut l = Log::default();
    l.push(log::ALLOC, 16, 10, 0, 0);
    l.push(log::FREE, 99, 10, 0, 0); // never allocated: dropped
    l.push(log::ALLOC, 32, 5, 0, 0);
    l.push(log::FREE, 16, 10, 0, 0);
    let p = prepare::prepare(&l, None, false);
    assert_eq!(p.actions, vec![0, 0, 1]);
    assert_eq!(p.ids, vec![0, 1, 0]);
    assert_eq!(p.source, vec![0, 2, 3]);
    assert_eq!((p.peak_live, p.peak_event), (15, 1));
}
