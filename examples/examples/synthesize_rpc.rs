//! Writes a synthetic ggml-rpc job of any length: a client's trace and its server's, as the hook
//! records them, for benchmarks of the RPC reader (`ggml-viz rpc`, and `export`/`report` of the
//! pair). The connection opens with an answered HELLO; then per token the client decodes
//! (a `llama_decode` span around a SET_TENSOR and a GRAPH_COMPUTE request) and reads the logits
//! (GET_TENSOR, answered); the server serves each command, its clock 5 ms ahead of the client's.
//! With `--unanswered` no GET_TENSOR is sent: no graph compute is ever answered. With
//! `--drift-ppm=N` the server's clock gains N µs a second on the client's.
//!
//! ```sh
//! cargo run --release -p ggml-viz-examples --example synthesize_rpc -- client.ggmlviz server.ggmlviz 1000000
//! ggml-viz rpc client.ggmlviz server.ggmlviz
//! ```

use std::io::Write;

use ggml_viz_reader::format::ext::{self, RpcBoundary, RpcPart, SpanBoundary};
use ggml_viz_reader::format::{self, ExtensionKind, Layout};

/// ggml-rpc's command bytes (protocol 7.0).
const HELLO: u8 = 14;
const SET_TENSOR: u8 = 6;
const GET_TENSOR: u8 = 8;
const GRAPH_COMPUTE: u8 = 10;
/// The server's clock against the client's.
const SERVER_AHEAD_NS: u64 = 5_000_000;
const ENDPOINT: &str = "10.0.0.2:50052";

/// One trace being written: its buffer and file, and the events in it.
struct Trace {
    out: std::io::BufWriter<std::fs::File>,
    buf: Vec<u8>,
    events: u64,
    thread: u32,
}

impl Trace {
    fn create(path: &str, thread: u32) -> std::io::Result<Trace> {
        let mut buf = Vec::with_capacity(1 << 20);
        format::encode_header(&mut buf);
        Ok(Trace {
            out: std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?),
            buf,
            events: 0,
            thread,
        })
    }

    /// Counts the record just encoded into the buffer, and writes the buffer out when full.
    fn recorded(&mut self) -> std::io::Result<()> {
        self.events += 1;
        if self.buf.len() > (1 << 20) - 4096 {
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// One part of command `index`, from `start` to `end`, moving `sent` and `received` bytes.
    #[allow(clippy::too_many_arguments)]
    fn rpc(
        &mut self,
        part: RpcPart,
        command: u8,
        index: u32,
        (start, end): (u64, u64),
        sent: u64,
        received: u64,
    ) -> std::io::Result<()> {
        let begin = RpcBoundary {
            part,
            command,
            connection: 1,
            index,
            endpoint: Some(ENDPOINT.into()),
            ..RpcBoundary::default()
        };
        let finish = RpcBoundary {
            endpoint: None,
            sent,
            received,
            ..begin.clone()
        };
        for (kind, at, payload) in [
            (ExtensionKind::RpcBegin, start, &begin),
            (ExtensionKind::RpcEnd, end, &finish),
        ] {
            ext::encode_extension(
                &mut self.buf,
                Layout::Packed,
                kind,
                at,
                self.thread,
                payload,
            );
            self.recorded()?;
        }
        Ok(())
    }

    fn span(&mut self, kind: ExtensionKind, at: u64) -> std::io::Result<()> {
        let span = SpanBoundary {
            name: "llama_decode".into(),
            n_tokens: Some(1),
            ..SpanBoundary::default()
        };
        let json = span.to_json();
        ext::encode_extension_json(&mut self.buf, Layout::Packed, kind, at, self.thread, &json);
        self.recorded()
    }

    fn finish(mut self) -> std::io::Result<u64> {
        self.out.write_all(&self.buf)?;
        self.out.flush()?;
        Ok(self.events)
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let unanswered = args.iter().any(|a| a == "--unanswered");
    let drift_ppm: f64 = (args.iter())
        .find_map(|a| a.strip_prefix("--drift-ppm="))
        .map_or(0.0, |n| n.parse().unwrap_or(0.0));
    let positional: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let (Some(client_path), Some(server_path), Some(tokens)) = (
        positional.first(),
        positional.get(1),
        positional.get(2).and_then(|n| n.parse::<u32>().ok()),
    ) else {
        eprintln!(
            "usage: synthesize_rpc CLIENT.ggmlviz SERVER.ggmlviz TOKENS [--unanswered] [--drift-ppm=N]"
        );
        std::process::exit(1);
    };
    let mut client = Trace::create(client_path, 100)?;
    let mut server = Trace::create(server_path, 200)?;
    let start = 1_700_000_000_000_000_000u64;
    let on_server = |t: u64| {
        let drifted = (drift_ppm * 1e-6 * (t - start) as f64) as i64;
        (t + SERVER_AHEAD_NS).saturating_add_signed(drifted)
    };
    let mut t = start;
    // A command the client sends at `t` (taking 2 µs), served as it arrives, for `serve_ns`;
    // answered (if `answer`) in the serve's last microsecond, the answer arriving 3 µs after.
    let command = |client: &mut Trace,
                   server: &mut Trace,
                   t: u64,
                   command: u8,
                   index: u32,
                   bytes: u64,
                   answer: bool,
                   serve_ns: u64|
     -> std::io::Result<u64> {
        client.rpc(RpcPart::Request, command, index, (t, t + 2_000), bytes, 0)?;
        let served = on_server(t + 2_000);
        let done = served + serve_ns;
        server.rpc(RpcPart::Serve, command, index, (served, done), 0, bytes)?;
        if answer {
            // The server's answer is inside its serve span; the client waits from its request's end.
            server.rpc(RpcPart::Answer, command, index, (done - 1_000, done), 16, 0)?;
            let arrived = t + 2_000 + serve_ns + 3_000;
            client.rpc(RpcPart::Answer, command, index, (t + 2_000, arrived), 0, 16)?;
            return Ok(arrived);
        }
        Ok(t + 2_000)
    };
    t = command(&mut client, &mut server, t, HELLO, 0, 1, true, 5_000)?;
    let mut index = 1;
    for _ in 0..tokens {
        client.span(ExtensionKind::SpanBegin, t)?;
        t = command(
            &mut client,
            &mut server,
            t + 1_000,
            SET_TENSOR,
            index,
            4_096,
            false,
            5_000,
        )?;
        t = command(
            &mut client,
            &mut server,
            t,
            GRAPH_COMPUTE,
            index + 1,
            65_536,
            false,
            90_000,
        )?;
        client.span(ExtensionKind::SpanEnd, t + 500)?;
        index += 2;
        if unanswered {
            t += 100_000;
        } else {
            t = command(
                &mut client,
                &mut server,
                t + 1_000,
                GET_TENSOR,
                index,
                64,
                true,
                95_000,
            )?;
            index += 1;
            t += 20_000;
        }
    }
    let events = client.finish()? + server.finish()?;
    println!("{events}");
    Ok(())
}
