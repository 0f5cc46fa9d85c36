//! ggml-rpc commands, read off the transport: a front end reports each call of a connection's
//! `send_data`, `recv_data` and `flush` (before and after the real call), and this module
//! follows the protocol's framing per connection and records each command's parts.
//!
//! The framing (ggml-rpc.cpp, `send_rpc_cmd`, `rpc_serve_client`): a request is the command
//! byte, an 8-byte payload size and the payload, each its own `send_data`, then `flush`; an
//! answer, where the command has one, is an 8-byte size and the payload. Which commands answer
//! is not assumed: a client that reads after a request is reading its answer.
//! - A client (a connection whose first call sends) records its request, from the command byte
//!   to the flush after the payload, and its answer, from when it starts reading to the last
//!   byte.
//! - A server (a connection whose first call receives) records serving each command, from the
//!   return of the one-byte read that brought the command to the start of the read that waits
//!   for the next: reading the payload, the work, the answer; and inside it its answer, from
//!   the answer's first byte to the flush after its last.
//!
//! Every connection opens with HELLO (command 14 in every protocol version): it numbers the
//! connection and restarts its count of commands, on both ends alike, which is how the two ends'
//! traces join. A connection's state lives in a small table keyed by its `socket_t` (a client's
//! HELLO and its later commands are sent from different threads), for the socket's lifetime:
//! made when the socket is (`connect`, `accept`), dropped when it is destroyed, so nothing of one
//! connection leaks into the next socket at the same address, and a closed socket never takes
//! a live one's room. A HELLO starts a connection afresh whatever came before. The table's lock
//! is only tried, a bounded number of times, so a lock left held by a `fork` never blocks the
//! host: that call then goes unrecorded, and is counted, as are the calls of a socket that found
//! the table full of live ones.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use ggml_viz_format::ext::RpcPart;

use super::events::spans::{rpc_edge, write_soon};
use super::raw::RpcEdge;
use super::recorder::count_rpc_call_unfollowed;

/// The command that opens every connection.
const HELLO: u8 = 14;

/// Which of a connection's transport functions was called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    Send,
    Recv,
    Flush,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Client,
    Server,
}

/// Where a connection is in the framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Between commands (a client: after an answer, or after a request nobody answered yet).
    Idle,
    /// The command byte went; the 8-byte size is next.
    Size,
    /// The payload: this many bytes are still to come.
    Payload(u64),
    /// A client: the request is sent; an answer may follow.
    Sent,
    /// A client reading an answer: its size next, then this many bytes.
    AnswerSize,
    AnswerPayload(u64),
    /// A server: the request is in; it is being served.
    Serving,
    /// The framing was not what we know: nothing more is recorded until the next HELLO.
    Lost,
}

struct Conn {
    socket: usize,
    role: Option<Role>,
    state: State,
    id: u32,
    index: u32,
    command: u8,
    sent: u64,
    received: u64,
    /// A server is sending its answer (from its first byte to the flush).
    answering: bool,
    endpoint: Option<Box<str>>,
}

impl Conn {
    fn new(socket: usize, endpoint: Option<Box<str>>) -> Conn {
        Conn {
            socket,
            role: None,
            state: State::Idle,
            id: 0,
            index: 0,
            command: 0,
            sent: 0,
            received: 0,
            answering: false,
            endpoint,
        }
    }

    /// Records the begin or end of this connection's current command's `part`.
    fn record_edge(&self, begin: bool, part: RpcPart) {
        let edge = RpcEdge {
            begin,
            part,
            command: self.command,
            connection: self.id,
            index: self.index,
            sent: self.sent,
            received: self.received,
            endpoint_id: 0,
        };
        rpc_edge(edge, self.endpoint.as_deref());
    }

    /// A command byte: HELLO opens a new connection (numbered afresh); any other is the next
    /// command on this one.
    fn command_begins(&mut self, command: u8) {
        static CONNECTIONS: AtomicU32 = AtomicU32::new(0);
        if command == HELLO {
            self.id = CONNECTIONS.fetch_add(1, Ordering::Relaxed) + 1;
            self.index = 0;
        } else if self.id == 0 || self.state == State::Lost {
            // Joined mid-connection (tracing began after its HELLO): unnumbered, unrecorded.
            self.state = State::Lost;
            return;
        } else {
            self.index += 1;
        }
        self.command = command;
        self.sent = 0;
        self.received = 0;
        self.answering = false;
        self.state = State::Size;
    }
}

/// Connections by socket, and the address a server listens on.
struct Table {
    conns: Vec<Conn>,
    listening: Option<Box<str>>,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    conns: Vec::new(),
    listening: None,
});

/// Live connections a table holds at most (a client has one per server, a server one per
/// client it is serving); a socket that finds it full of live ones goes unrecorded, counted.
const MAX_CONNS: usize = 64;

/// The table, if its lock can be had within a few tries (see the module's notes); else the
/// call is counted as not followed.
fn table() -> Option<std::sync::MutexGuard<'static, Table>> {
    for _ in 0..64 {
        match TABLE.try_lock() {
            Ok(t) => return Some(t),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    count_rpc_call_unfollowed();
    None
}

impl Table {
    /// `socket`'s connection (one made before tracing began is met here first); `None`, counted,
    /// when the table is full of live ones.
    fn conn(&mut self, socket: usize) -> Option<&mut Conn> {
        if let Some(i) = self.conns.iter().position(|c| c.socket == socket) {
            return Some(&mut self.conns[i]);
        }
        self.fresh(socket, self.listening.clone())
    }

    /// A new connection on `socket`, whatever the table held for that address before.
    fn fresh(&mut self, socket: usize, endpoint: Option<Box<str>>) -> Option<&mut Conn> {
        self.conns.retain(|c| c.socket != socket);
        if self.conns.len() == MAX_CONNS {
            count_rpc_call_unfollowed();
            return None;
        }
        self.conns.push(Conn::new(socket, endpoint));
        self.conns.last_mut()
    }
}

/// A client connected `socket` to `host:port`.
pub fn rpc_connected(socket: usize, endpoint: &str) {
    let Some(mut t) = table() else { return };
    t.fresh(socket, Some(endpoint.into()));
}

/// A server accepted a client on `socket`: a connection begins, named by the address served.
pub fn rpc_accepted(socket: usize) {
    let Some(mut t) = table() else { return };
    let endpoint = t.listening.clone();
    if let Some(conn) = t.fresh(socket, endpoint) {
        conn.role = Some(Role::Server);
    }
}

/// `socket` is being destroyed: its connection ends, and leaves the table. A server's client
/// is done: what it recorded is written now (a server is stopped by a signal).
pub fn rpc_closed(socket: usize) {
    let Some(mut t) = table() else { return };
    let Some(i) = t.conns.iter().position(|c| c.socket == socket) else {
        return;
    };
    let conn = t.conns.swap_remove(i);
    if conn.role == Some(Role::Server) && conn.id != 0 {
        write_soon();
    }
}

/// A server listens on `host:port`: its connections are named by it.
pub fn rpc_listening(endpoint: &str) {
    let Some(mut t) = table() else { return };
    t.listening = Some(endpoint.into());
}

/// Before the real call: `data` and `size` as passed; a send's bytes are readable.
///
/// # Safety
/// For a send, `data` points to `size` readable bytes (the transport's own contract).
pub unsafe fn rpc_before(socket: usize, transfer: Transfer, data: *const u8, size: usize) {
    let Some(mut t) = table() else { return };
    let Some(conn) = t.conn(socket) else { return };
    match (transfer, conn.role) {
        (Transfer::Send, None) => conn.role = Some(Role::Client),
        (Transfer::Recv, None) => conn.role = Some(Role::Server),
        _ => {}
    }
    match (conn.role, transfer, conn.state) {
        (Some(Role::Client), Transfer::Send, State::Idle | State::Sent | State::Lost)
            if size == 1 =>
        {
            // SAFETY: one readable byte, the caller's contract.
            conn.command_begins(unsafe { *data });
            if conn.state == State::Size {
                conn.sent = 1;
                conn.record_edge(true, RpcPart::Request);
            }
        }
        (Some(Role::Client), Transfer::Send, State::Size) if size == 8 => {
            // SAFETY: eight readable bytes, the caller's contract; unaligned as it may be.
            let n = unsafe { data.cast::<u64>().read_unaligned() };
            conn.sent += 8;
            conn.state = State::Payload(n);
        }
        (Some(Role::Client), Transfer::Send, State::Payload(left)) if size as u64 <= left => {
            conn.sent += size as u64;
            conn.state = State::Payload(left - size as u64);
        }
        (Some(Role::Client), Transfer::Recv, State::Sent) if size == 8 => {
            conn.received = 0;
            conn.sent = 0;
            conn.state = State::AnswerSize;
            conn.record_edge(true, RpcPart::Answer);
        }
        (Some(Role::Server), Transfer::Recv, State::Idle | State::Serving | State::Lost)
            if size == 1 =>
        {
            if conn.state == State::Serving {
                conn.record_edge(false, RpcPart::Serve);
            }
            if conn.state != State::Lost {
                conn.state = State::Idle;
            }
        }
        (Some(Role::Server), Transfer::Send, State::Serving) => {
            if !conn.answering {
                // The answer's first byte: the earliest the client can have it.
                conn.answering = true;
                conn.sent = 0;
                conn.record_edge(true, RpcPart::Answer);
            }
            conn.sent += size as u64;
        }
        // Anything else a client sends is not the framing we know.
        (Some(Role::Client), Transfer::Send, state) if state != State::Lost => {
            conn.state = State::Lost;
        }
        _ => {}
    }
}

/// After the real call, which returned `ok`; a receive's bytes are readable when it succeeded.
///
/// # Safety
/// For a successful receive, `data` points to `size` readable bytes.
pub unsafe fn rpc_after(socket: usize, transfer: Transfer, data: *const u8, size: usize, ok: bool) {
    let Some(mut t) = table() else { return };
    let Some(conn) = t.conn(socket) else { return };
    if !ok {
        // The connection failed or closed: nothing of it is open any more. A server's client
        // is done: what it recorded is written now (a server is stopped by a signal).
        if conn.role == Some(Role::Server) && conn.id != 0 {
            write_soon();
        }
        conn.state = State::Idle;
        conn.id = 0;
        return;
    }
    match (conn.role, transfer, conn.state) {
        (Some(Role::Client), Transfer::Flush, State::Payload(0)) => {
            conn.state = State::Sent;
            conn.record_edge(false, RpcPart::Request);
        }
        (Some(Role::Client), Transfer::Recv, State::AnswerSize) if size == 8 => {
            // SAFETY: eight bytes just received, the caller's contract.
            let n = unsafe { data.cast::<u64>().read_unaligned() };
            conn.received = 8;
            conn.state = State::AnswerPayload(n);
            if n == 0 {
                conn.state = State::Idle;
                conn.record_edge(false, RpcPart::Answer);
            }
        }
        (Some(Role::Client), Transfer::Recv, State::AnswerPayload(left)) if size as u64 <= left => {
            conn.received += size as u64;
            conn.state = State::AnswerPayload(left - size as u64);
            if left == size as u64 {
                conn.state = State::Idle;
                conn.record_edge(false, RpcPart::Answer);
            }
        }
        (Some(Role::Server), Transfer::Recv, State::Idle | State::Lost) if size == 1 => {
            // SAFETY: one byte just received.
            let command = unsafe { *data };
            if conn.state == State::Lost && command != HELLO {
                return;
            }
            conn.command_begins(command);
            if conn.state == State::Size {
                conn.received = 1;
                conn.record_edge(true, RpcPart::Serve);
            }
        }
        (Some(Role::Server), Transfer::Recv, State::Size) if size == 8 => {
            // SAFETY: eight bytes just received.
            let n = unsafe { data.cast::<u64>().read_unaligned() };
            conn.received += 8;
            conn.state = if n == 0 {
                State::Serving
            } else {
                State::Payload(n)
            };
        }
        (Some(Role::Server), Transfer::Recv, State::Payload(left)) if size as u64 <= left => {
            conn.received += size as u64;
            conn.state = if left == size as u64 {
                State::Serving
            } else {
                State::Payload(left - size as u64)
            };
        }
        (Some(Role::Server), Transfer::Flush, State::Serving) if conn.answering => {
            conn.answering = false;
            let received = std::mem::take(&mut conn.received);
            conn.record_edge(false, RpcPart::Answer);
            conn.received = received;
        }
        _ => {}
    }
}
