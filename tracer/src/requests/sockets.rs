//! Which `struct sock` is which fd, and when data arrived on each socket.
//!
//! `DATA_READY` runs outside the target's context, so it only names the sk; in-context
//! `SOCK_FD` events pair sks with fds (the latest pair wins). Per sk we keep the recent
//! data-ready timestamps and a `since` mark: the enter of the last send on that socket. A
//! request's arrival is the first data-ready at or after `since` (the previous response).
//!
//! Choices where the model is loose:
//! - `since` moves on every successful send on the fd, not only on a request's `t_done`, so a
//!   response whose request was lost or never seen still closes the previous exchange.
//! - History is bounded: entries older than the prune horizon, or beyond [`READY_CAP`] per sk,
//!   are dropped, and the newest dropped ts is remembered. A lookup whose answer might have
//!   been dropped returns an error instead of a later, wrong timestamp.

use std::collections::{HashMap, VecDeque};

/// Data-ready timestamps kept per socket at most (a body arriving in many segments).
pub(crate) const READY_CAP: usize = 256;

#[derive(Default)]
struct SkState {
    ready: VecDeque<u64>,
    since: u64,
    max_dropped: Option<u64>,
}

impl SkState {
    fn first_at_or_after(&self, x: u64) -> Result<Option<u64>, &'static str> {
        if self.max_dropped.is_some_and(|d| d >= x) {
            return Err("data-ready history dropped");
        }
        let i = self.ready.partition_point(|&t| t < x);
        Ok(self.ready.get(i).copied())
    }
}

#[derive(Clone, Copy, Default)]
struct FdState {
    sk: Option<u64>,
    /// A client connection (accepted, or named by a request begin) until reconnected.
    client: bool,
    /// (enter, exit) of the last successful receive on this fd.
    last_recv: Option<(u64, u64)>,
}

#[derive(Default)]
pub(crate) struct Sockets {
    fds: HashMap<u64, FdState>,
    sks: HashMap<u64, SkState>,
    fd_of_sk: HashMap<u64, u64>,
    /// The remote port of each socket ESTABLISHED said, while the socket has its fd (or is
    /// unclaimed): the client's, for a client connection.
    ports: HashMap<u64, u16>,
    /// ESTABLISHED sks on a listening port not yet read by the target, and when.
    unclaimed: HashMap<u64, u64>,
    /// Of those, how many were never read before the prune horizon passed them (never
    /// accepted, another process on the port, or another netns where the kernel matches by
    /// port alone).
    pub(crate) never_claimed: u64,
}

impl Sockets {
    pub(crate) fn sock_fd(&mut self, sk: u64, fd: u64) {
        let state = self.fds.entry(fd).or_default();
        if let Some(old) = state.sk.replace(sk)
            && old != sk
        {
            self.fd_of_sk.remove(&old);
            self.ports.remove(&old);
        }
        self.fd_of_sk.insert(sk, fd);
        self.unclaimed.remove(&sk);
    }

    /// `accept` returned `fd`: a new client connection, whatever the fd meant before.
    pub(crate) fn accepted(&mut self, fd: u64) {
        if let Some(old) = self.fds.remove(&fd).and_then(|s| s.sk) {
            self.fd_of_sk.remove(&old);
            self.ports.remove(&old);
        }
        self.mark_client(fd);
    }

    /// `connect` on `fd`: an outgoing connection, whatever the fd meant before.
    pub(crate) fn connected(&mut self, fd: u64) {
        if let Some(old) = self.fds.remove(&fd).and_then(|s| s.sk) {
            self.fd_of_sk.remove(&old);
            self.ports.remove(&old);
        }
    }

    pub(crate) fn mark_client(&mut self, fd: u64) {
        self.fds.entry(fd).or_default().client = true;
    }

    pub(crate) fn is_client(&self, fd: u64) -> bool {
        self.fds.get(&fd).is_some_and(|s| s.client)
    }

    /// A new connection reached ESTABLISHED: a reused sk pointer starts a fresh history.
    pub(crate) fn established(&mut self, ts: u64, sk: u64, remote_port: Option<u16>) {
        self.sks.insert(sk, SkState::default());
        self.unclaimed.insert(sk, ts);
        match remote_port {
            Some(port) => self.ports.insert(sk, port),
            None => self.ports.remove(&sk),
        };
    }

    /// The remote port of `sk`, if its ESTABLISHED said it.
    pub(crate) fn peer_port(&self, sk: u64) -> Option<u16> {
        self.ports.get(&sk).copied()
    }

    pub(crate) fn data_ready(&mut self, ts: u64, sk: u64) {
        let state = self.sks.entry(sk).or_default();
        state.ready.push_back(ts);
        if state.ready.len() > READY_CAP {
            state.max_dropped = state.ready.pop_front();
        }
    }

    pub(crate) fn received(&mut self, fd: u64, enter: u64, exit: u64) {
        self.fds.entry(fd).or_default().last_recv = Some((enter, exit));
    }

    pub(crate) fn sent(&mut self, fd: u64, enter: u64) {
        if let Some(sk) = self.sk_of(fd) {
            let state = self.sks.entry(sk).or_default();
            state.since = state.since.max(enter);
        }
    }

    pub(crate) fn sk_of(&self, fd: u64) -> Option<u64> {
        self.fds.get(&fd).and_then(|s| s.sk)
    }

    pub(crate) fn fd_of(&self, sk: u64) -> Option<u64> {
        self.fd_of_sk.get(&sk).copied()
    }

    pub(crate) fn last_recv(&self, fd: u64) -> Option<(u64, u64)> {
        self.fds.get(&fd).and_then(|s| s.last_recv)
    }

    /// The first data-ready on `fd`'s socket since its last send: the pending arrival.
    pub(crate) fn pending_arrival(&self, fd: u64) -> Result<u64, &'static str> {
        let sk = self.sk_of(fd).ok_or("client socket unknown")?;
        let state = self.sks.get(&sk).ok_or("arrival not seen")?;
        state
            .first_at_or_after(state.since)?
            .ok_or("arrival not seen")
    }

    /// The first data-ready on `sk` at or after `x`.
    pub(crate) fn first_ready(&self, sk: u64, x: u64) -> Result<Option<u64>, &'static str> {
        match self.sks.get(&sk) {
            Some(state) => state.first_at_or_after(x),
            None => Ok(None),
        }
    }

    /// Forget data-ready history before `horizon`. A socket with nothing left that a lookup
    /// could miss is removed entirely, so closed connections do not accumulate.
    pub(crate) fn prune(&mut self, horizon: u64) {
        let before = self.unclaimed.len();
        let ports = &mut self.ports;
        self.unclaimed.retain(|sk, &mut ts| {
            let keep = ts >= horizon;
            if !keep {
                ports.remove(sk);
            }
            keep
        });
        self.never_claimed += (before - self.unclaimed.len()) as u64;
        self.sks.retain(|_, s| {
            while s.ready.front().is_some_and(|&t| t < horizon) {
                s.max_dropped = s.ready.pop_front();
            }
            // Empty, and every dropped entry predates `since`: a fresh state gives the same
            // answers (every future entry is newer than `since`).
            let forgettable = s.ready.is_empty() && s.max_dropped.is_none_or(|d| d < s.since);
            !forgettable
        });
    }

    #[cfg(test)]
    pub(crate) fn socket_count(&self) -> usize {
        self.sks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sockets where socket `0xa` is known as fd 7.
    fn fd_7_on_socket_a() -> Sockets {
        let mut s = Sockets::default();
        s.sock_fd(0xa, 7);
        s
    }

    #[test]
    fn arrival_is_first_ready_since_last_send() {
        let mut s = fd_7_on_socket_a();
        s.data_ready(100, 0xa);
        s.data_ready(120, 0xa);
        assert_eq!(s.pending_arrival(7), Ok(100));
        s.sent(7, 200);
        assert_eq!(s.pending_arrival(7), Err("arrival not seen"));
        s.data_ready(300, 0xa);
        assert_eq!(s.pending_arrival(7), Ok(300));
    }

    #[test]
    fn dropped_history_is_an_error_not_a_later_answer() {
        let mut s = fd_7_on_socket_a();
        s.data_ready(100, 0xa);
        s.data_ready(150, 0xa);
        s.prune(120);
        assert_eq!(s.pending_arrival(7), Err("data-ready history dropped"));
    }

    #[test]
    fn idle_sockets_are_forgotten() {
        let mut s = fd_7_on_socket_a();
        s.data_ready(100, 0xa);
        s.sent(7, 200);
        s.prune(300);
        assert_eq!(s.socket_count(), 0);
        s.data_ready(400, 0xa);
        assert_eq!(s.pending_arrival(7), Ok(400));
    }

    #[test]
    fn accept_forgets_the_old_pair() {
        let mut s = fd_7_on_socket_a();
        s.accepted(7);
        assert_eq!(s.sk_of(7), None);
        assert_eq!(s.fd_of(0xa), None);
    }
}
