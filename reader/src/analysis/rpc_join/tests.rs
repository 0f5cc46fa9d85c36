use super::clocks::bound;
use super::*;
use crate::telemetry::ProcessId;

const SHIFT: i64 = 5_000_000;

/// Numbers below `n`, the same every run from `seed` (xorshift).
fn numbers(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

/// A command on both ends: the client sends at `at`; the request takes `out` ns to reach
/// the server, whose clock is `shift` ahead; it answers (if `back` is given) after 2 µs,
/// and the answer takes `back` ns to arrive.
#[allow(clippy::too_many_arguments)]
fn command(
    parts: &mut RpcParts,
    (client, server): (u32, u32),
    shift: i64,
    index: u32,
    name: &str,
    bytes: u64,
    at: u64,
    out: u64,
    back: Option<u64>,
) {
    let command = parts.command_id(&name.into());
    let parts = &mut parts.parts;
    let part = |process, part, start_ns, end_ns, sent, received| CommandPart {
        process: ProcessId(process),
        part,
        command,
        connection: 1,
        index,
        start_ns,
        end_ns,
        sent,
        received,
    };
    let served = (at + out) as i64 + shift;
    parts.push(part(client, Part::Request, at, at + 1_000, bytes, 0));
    let end = served as u64 + 3_000;
    if let Some(back) = back {
        let answering = served as u64 + 2_000;
        parts.push(part(server, Part::Answer, answering, end, 12, 0));
        let arrives = (answering as i64 - shift) as u64 + back;
        parts.push(part(client, Part::Answer, at + 1_000, arrives, 0, 12));
    }
    parts.push(part(server, Part::Serve, served as u64, end, 0, bytes));
}

#[test]
fn joins_by_commands_and_bounds_the_offset_from_both_sides() {
    let mut parts = RpcParts::default();
    let p = &mut parts;
    // Client process 0 talks to server 1 (clock 5 ms ahead) ...
    command(
        p,
        (0, 1),
        SHIFT,
        0,
        "HELLO",
        33,
        1_000,
        10_000,
        Some(20_000),
    );
    command(
        p,
        (0, 1),
        SHIFT,
        1,
        "GRAPH_COMPUTE",
        1_814,
        100_000,
        4_000,
        None,
    );
    command(
        p,
        (0, 1),
        SHIFT,
        2,
        "GET_TENSOR",
        49,
        200_000,
        15_000,
        Some(6_000),
    );
    // ... and server 2 saw another graph: not the same connection.
    let mut other = RpcParts::default();
    command(
        &mut other,
        (9, 2),
        0,
        0,
        "HELLO",
        33,
        1_000,
        10_000,
        Some(10_000),
    );
    command(
        &mut other,
        (9, 2),
        0,
        1,
        "GRAPH_COMPUTE",
        2_000,
        100_000,
        10_000,
        None,
    );
    for &part in other.parts.iter().filter(|c| c.process == ProcessId(2)) {
        let command = parts.command_id(&other.command_name(part.command).into());
        parts.parts.push(CommandPart { command, ..part });
    }
    let a = analyse(&parts);

    assert_eq!(a.links.len(), 1, "{:?}", a.links);
    assert_eq!(
        (a.links[0].client_process, a.links[0].server_process),
        (ProcessId(0), ProcessId(1))
    );
    assert_eq!(a.joined.len(), 3);
    assert_eq!(a.unjoined_client_connections, 0);
    // Lower bounds: −shift − each request's way out (the tightest: 4 µs); upper bounds:
    // −shift + each answer's way back (the tightest: 6 µs).
    let o = a.offset_of(ProcessId(1)).expect("an offset for server 1");
    assert_eq!(o.lower_ns, -SHIFT - 4_000);
    assert_eq!(o.upper_ns, Some(-SHIFT + 6_000));
    assert_eq!(o.offset_ns, -SHIFT + 1_000);
    assert_eq!(o.uncertainty_ns(), Some(5_000));
    assert_eq!(o.commands, 3);
    assert!(a.offset_of(ProcessId(2)).is_none());

    // The client's table: counts and bytes per command, times from its spans.
    let hello = &a.commands["HELLO"];
    assert_eq!((hello.count, hello.sent, hello.received), (1, 33, 12));
    assert_eq!(hello.request_ns, 1_000);
    let compute = &a.commands["GRAPH_COMPUTE"];
    assert_eq!(
        (compute.count, compute.sent, compute.answer_ns),
        (1, 1_814, 0)
    );
}

#[test]
fn a_client_connection_whose_server_was_not_traced_is_counted() {
    let mut parts = RpcParts::default();
    command(&mut parts, (0, 1), 0, 0, "HELLO", 33, 0, 10, Some(10));
    parts.parts.retain(|c| c.process == ProcessId(0));
    let a = analyse(&parts);
    assert!(a.links.is_empty());
    assert_eq!(a.unjoined_client_connections, 1);
    assert!(a.offsets.is_empty());
}

/// A long irregular job (uneven gaps, overlapping computes, commands left unanswered, decodes
/// the servers have not finished before the next begins, the client's own computes): the
/// sweep's per-token breakdown and the backward pass's graph-compute times equal those of
/// the plain per-token scans they replaced, written out here.
#[test]
fn the_sweeps_give_what_plain_scans_give() {
    let mut parts = RpcParts::default();
    let mut random = numbers(0x2545_f491_4f6c_dd1d);
    let mut t = 1_000_000;
    let mut index = 0;
    for _ in 0..400 {
        parts
            .decodes
            .push((ProcessId(0), t, t + 5_000 + random(20_000)));
        if random(4) == 0 {
            parts.local_computes.push((
                ProcessId(0),
                t + random(3_000),
                t + 3_000 + random(60_000),
            ));
        }
        for _ in 0..1 + random(3) {
            let name = ["GRAPH_COMPUTE", "SET_TENSOR", "GET_TENSOR"][random(3) as usize];
            let back = (random(3) != 0).then(|| 1_000 + random(5_000));
            command(
                &mut parts,
                (0, 1),
                SHIFT,
                index,
                name,
                64,
                t,
                500 + random(4_000),
                back,
            );
            index += 1;
            t += 2_000 + random(40_000);
        }
        t += random(30_000);
    }
    let a = analyse(&parts);
    assert_eq!(a.joined.len(), index as usize);

    // Graph computes: the next answer on the link, scanned forward from each.
    let mut expected = Vec::new();
    for (n, j) in a.joined.iter().enumerate() {
        let request = parts.part(j.request);
        if !parts.is_graph_compute(request.command) {
            continue;
        }
        let answered = (a.joined[n + 1..].iter())
            .take_while(|k| k.link == j.link)
            .find_map(|k| k.answer);
        if let Some(answer) = answered {
            expected.push((n, parts.part(answer).end_ns - request.start_ns));
        }
    }
    assert!(expected.len() > 50, "{}", expected.len());
    assert_eq!(a.computes_answered, expected);

    // Tokens: every interval clipped to each window, in the order of precedence.
    let offset = a.offset_of(ProcessId(1)).unwrap().offset_ns;
    let mut decodes = parts.decodes.clone();
    decodes.sort_unstable();
    let mut expected = Vec::new();
    for (i, &(_, lo, end)) in decodes.iter().enumerate() {
        let hi = match decodes.get(i + 1) {
            Some(next) => next.1,
            None => (parts.parts.iter())
                .filter(|p| p.process == ProcessId(0) && p.start_ns >= lo)
                .map(|p| p.end_ns)
                .max()
                .unwrap_or(end)
                .max(end),
        };
        let mut busy = vec![0u8; (hi - lo) as usize];
        let mut mark = |a: u64, b: u64, level: u8| {
            let mut ns = 0;
            for t in a.max(lo)..b.min(hi) {
                let slot = &mut busy[(t - lo) as usize];
                if *slot == 0 {
                    *slot = level;
                    ns += 1;
                }
            }
            ns
        };
        let mut server_ns = 0;
        for j in &a.joined {
            let serve = parts.part(j.serve);
            if parts.is_graph_compute(serve.command) {
                let on_client = |t: u64| t.saturating_add_signed(offset);
                server_ns += mark(on_client(serve.start_ns), on_client(serve.end_ns), 1);
            }
        }
        let own = parts
            .local_computes
            .iter()
            .map(|&(_, a, b)| mark(a, b, 2))
            .sum();
        let moving = (parts.parts.iter())
            .filter(|p| p.process == ProcessId(0))
            .map(|p| mark(p.start_ns, p.end_ns, 3))
            .sum();
        let idle = busy.iter().filter(|&&b| b == 0).count() as u64;
        expected.push(TokenTime {
            client_process: ProcessId(0),
            start_ns: lo,
            end_ns: hi,
            servers: vec![(ProcessId(1), server_ns)],
            client_compute_ns: own,
            transfer_ns: moving,
            idle_ns: idle,
        });
    }
    let tokens = a.tokens(&parts);
    assert!(tokens.iter().filter(|t| t.client_compute_ns > 0).count() > 20);
    assert!(tokens.iter().filter(|t| t.servers[0].1 > 0).count() > 100);
    assert_eq!(tokens, expected);
}

/// A server whose clock gains 100 µs a second on the client's, over 200 s of commands
/// answered within a millisecond: the 20 ms it drifts make the commands' bounds on one
/// constant offset contradict each other, and the offset is then a line. Its slope is the
/// drift, every command's bounds hold on it, and it puts server times on the client's clock
/// within its stated uncertainty at the start and at the end.
#[test]
fn a_drifting_clock_gets_a_line() {
    let drift = 100e-6;
    let mut parts = RpcParts::default();
    let mut random = numbers(0x9e37_79b9_7f4a_7c15);
    let start = 1_000_000_000u64;
    let true_offset = |t: u64| -SHIFT - (drift * (t - start) as f64) as i64;
    for index in 0..2_000u32 {
        let at = start + u64::from(index) * 100_000_000;
        // The request arrives `out` later; the server's clock then reads `at + out − θ`.
        let (out, back) = (20_000 + random(400_000), 20_000 + random(400_000));
        let shift = -true_offset(at + out);
        command(
            &mut parts,
            (0, 1),
            shift,
            index,
            "GET_TENSOR",
            64,
            at,
            out,
            Some(back),
        );
    }
    let a = analyse(&parts);
    let o = a.offset_of(ProcessId(1)).unwrap();
    let disagreement = o.disagreement_ns().expect("one constant offset cannot fit");
    assert!(disagreement > 10_000_000, "{disagreement}");
    assert!(!o.kept_own_clock);
    let d = o.drift.expect("a drift");
    assert!((d.slope + drift).abs() < 2e-6, "{}", d.slope);
    let uncertainty = o.uncertainty_ns().unwrap();
    assert!((0..500_000).contains(&uncertainty), "{uncertainty}");
    for j in &a.joined {
        let (t, lower, upper) = bound(&parts, j);
        let at = o.at(t);
        assert!(
            lower <= at + 1 && at <= upper.unwrap() + 1,
            "{lower} {at} {upper:?}"
        );
    }
    for t in [start, start + 199 * 1_000_000_000] {
        let error = (o.at(t) - true_offset(t)).abs();
        assert!(error <= uncertainty + 1, "{error} > {uncertainty} at {t}");
    }
}

/// Bounds that no line fits (two servers' commands filed under one connection, their clocks
/// 40 ms apart): the server keeps its own clock (offset 0, nothing to align), and how much
/// the bounds disagree is told.
#[test]
fn bounds_no_line_fits_keep_the_servers_own_clock() {
    let mut parts = RpcParts::default();
    for index in 0..400u32 {
        let shift = if index % 2 == 0 {
            SHIFT
        } else {
            SHIFT + 40_000_000
        };
        let at = 1_000_000 + u64::from(index) * 1_000_000;
        command(
            &mut parts,
            (0, 1),
            shift,
            index,
            "GET_TENSOR",
            64,
            at,
            50_000,
            Some(50_000),
        );
    }
    let a = analyse(&parts);
    let o = a.offset_of(ProcessId(1)).unwrap();
    assert!(o.kept_own_clock);
    assert_eq!((o.offset_ns, o.drift, o.uncertainty_ns()), (0, None, None));
    // Lower bounds reach −SHIFT − 50 µs (the way out), upper ones come down to
    // −SHIFT − 40 ms + 50 µs (the way back).
    assert_eq!(o.disagreement_ns(), Some(40_000_000 - 100_000));
    let alignments = a.alignments(&parts, 2, |p| Some(p.0 as usize), true);
    assert!(alignments[1].clock.is_none());
}

/// Times and bounds at the ends of their ranges (a hostile or corrupt trace) give bounds and
/// an uncertainty, never an overflow.
#[test]
fn extreme_times_saturate() {
    let mut parts = RpcParts::default();
    command(&mut parts, (0, 1), 0, 0, "HELLO", 1, 0, 10, Some(10));
    let serve = parts
        .parts
        .iter_mut()
        .find(|p| p.part == Part::Serve)
        .unwrap();
    serve.start_ns = u64::MAX;
    let client_answer = (parts.parts.iter_mut())
        .find(|p| p.part == Part::Answer && p.process == ProcessId(0))
        .unwrap();
    client_answer.end_ns = u64::MAX;
    let a = analyse(&parts);
    let o = a.offset_of(ProcessId(1)).unwrap();
    assert_eq!(o.lower_ns, -i64::MAX);
    assert_eq!(o.upper_ns, Some(i64::MAX - 2_010)); // less the server answer's start
    assert_eq!(o.uncertainty_ns(), Some(i64::MAX / 2));
    let _ = a.tokens(&parts);
}
