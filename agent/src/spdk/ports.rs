//! The listen ports of the SPDK exporter's range and the subsystem (NQN) that owns each, kept
//! in memory so that choosing, committing and freeing a port costs O(1) (amortised) however
//! many volumes the node exports, instead of a walk over every subsystem and listener of the
//! target for each new export.
//!
//! The invariant this map holds: a port is owned by at most one NQN, as its host listener or
//! as its migration pipe's. Nothing else holds it: SPDK lets a second subsystem listen on a
//! port that is already listened on without an error (the transport's listener is shared), it
//! keeps listening after a subsystem is deleted, and removing a pipe's listener stops the
//! transport listening on that port for every subsystem. So two NQNs on one port would be
//! reachable through each other's port and lose it together.
//!
//! SPDK runs in the agent's process, so the target and this map start empty together; every
//! port the target listens on for a subsystem was handed out here.

use std::collections::{HashMap, HashSet, VecDeque};

/// What a subsystem uses a port for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The listener hosts connect to (the one recorded in `spec.spdkTarget.svcID`).
    Host,
    /// The second listener of a migration destination, which the source's mirror connects to.
    Pipe,
}

/// Who holds a port of the range.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Free,
    /// Handed out by [`PortMap::take`] and not committed yet: the subsystem or listener may
    /// be in the making on the reactor (or made there by a call that was cancelled since),
    /// so the port stays with this NQN until its next export or removal settles it.
    Pending(String),
    Host(String),
    Pipe(String),
}

impl Slot {
    fn owner(&self) -> Option<&str> {
        match self {
            Self::Free => None,
            Self::Pending(n) | Self::Host(n) | Self::Pipe(n) => Some(n),
        }
    }
}

/// Every port of the range is taken or being given to another volume.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "every port of {lo}-{hi} is taken or being given to another volume; widen the listen port range"
)]
pub struct NoFreePort {
    /// First port of the range.
    pub lo: u16,
    /// Last port of the range.
    pub hi: u16,
}

/// A port owned by another NQN than the one that wanted it (see [`PortMap::commit`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("port {port} is owned by {owner}, not by {nqn}")]
pub struct PortConflict {
    /// The port.
    pub port: u16,
    /// The NQN that wanted it.
    pub nqn: String,
    /// The NQN that owns it.
    pub owner: String,
}

/// The ports of one range and their owners; see the module documentation.
#[derive(Debug)]
pub struct PortMap {
    lo: u16,
    hi: u16,
    /// Index `port - lo`.
    slots: Vec<Slot>,
    /// Candidates for the next port handed out, least recently freed first (so ports go
    /// round-robin through the range, and a port just freed is the last to be used again).
    /// An entry whose slot is no longer free is stale and skipped when it comes up.
    fifo: VecDeque<u16>,
    /// Whether a port has an entry in `fifo`, so that it has at most one.
    in_fifo: Vec<bool>,
    /// Every port each NQN holds, in any role.
    owned: HashMap<String, Vec<u16>>,
    /// The host listener's port of each NQN.
    host: HashMap<String, u16>,
    /// The pipe listener's port of each NQN that has one.
    pipes: HashMap<String, u16>,
}

impl PortMap {
    /// Every port of `ports` free, to be handed out from the first.
    pub fn new(ports: &std::ops::RangeInclusive<u16>) -> Self {
        let (lo, hi) = (*ports.start(), *ports.end());
        let n = if hi >= lo {
            usize::from(hi - lo) + 1
        } else {
            0
        };
        Self {
            lo,
            hi,
            slots: vec![Slot::Free; n],
            fifo: ports.clone().collect(),
            in_fifo: vec![true; n],
            owned: HashMap::new(),
            host: HashMap::new(),
            pipes: HashMap::new(),
        }
    }

    fn index(&self, port: u16) -> Option<usize> {
        (port >= self.lo && port <= self.hi).then(|| usize::from(port - self.lo))
    }

    fn slot(&self, port: u16) -> Option<&Slot> {
        self.index(port).map(|i| &self.slots[i])
    }

    /// The host listener's port of `nqn`.
    pub fn host(&self, nqn: &str) -> Option<u16> {
        self.host.get(nqn).copied()
    }

    /// The pipe listener's port of `nqn`.
    pub fn pipe(&self, nqn: &str) -> Option<u16> {
        self.pipes.get(nqn).copied()
    }

    /// Whether `port` may go to `nqn` for `role` without a pop from the FIFO: free, or
    /// already `nqn`'s and not its pipe (a host port is never turned into a pipe's).
    fn usable_by(&self, port: u16, nqn: &str, role: Role) -> bool {
        match self.slot(port) {
            Some(Slot::Free) => true,
            Some(Slot::Pending(n) | Slot::Host(n)) => role == Role::Host && n == nqn,
            _ => false,
        }
    }

    /// A port for `nqn`'s `role` listener, marked pending for `nqn` until [`Self::commit`]
    /// (or [`Self::abandon`]). A host port is, in this order: `preferred` when it is free or
    /// already `nqn`'s (an earlier export recorded it); the host port `nqn` already holds (a
    /// subsystem made again keeps its port); a port left pending for `nqn` by a cancelled
    /// call; else the next free port round-robin. A pipe port is always the next free one.
    /// Ports in `tried` are passed over. Amortised O(1): each stale FIFO entry is skipped
    /// once.
    pub fn take(
        &mut self,
        nqn: &str,
        role: Role,
        preferred: Option<u16>,
        tried: &HashSet<u16>,
    ) -> Result<u16, NoFreePort> {
        let own = if role == Role::Host {
            let mut own: Vec<u16> = preferred.into_iter().collect();
            own.extend(self.host(nqn));
            own.extend(
                self.owned
                    .get(nqn)
                    .into_iter()
                    .flatten()
                    .filter(|p| matches!(self.slot(**p), Some(Slot::Pending(_)))),
            );
            own
        } else {
            Vec::new()
        };
        if let Some(p) = own
            .into_iter()
            .find(|p| !tried.contains(p) && self.usable_by(*p, nqn, role))
        {
            self.hold(p, Slot::Pending(nqn.to_string()));
            return Ok(p);
        }
        let mut passed = Vec::new();
        let mut found = None;
        while let Some(p) = self.fifo.pop_front() {
            let Some(i) = self.index(p) else { continue };
            self.in_fifo[i] = false;
            if self.slots[i] != Slot::Free {
                continue;
            }
            if tried.contains(&p) {
                passed.push(p);
                continue;
            }
            found = Some(p);
            break;
        }
        // Tried ports keep their turn: back at the front, in their order.
        for p in passed.into_iter().rev() {
            if let Some(i) = self.index(p) {
                self.in_fifo[i] = true;
                self.fifo.push_front(p);
            }
        }
        let p = found.ok_or(NoFreePort {
            lo: self.lo,
            hi: self.hi,
        })?;
        self.hold(p, Slot::Pending(nqn.to_string()));
        Ok(p)
    }

    /// Give `port` to the owner of `slot` (a free port, or one that owner holds already).
    fn hold(&mut self, port: u16, slot: Slot) {
        let Some(nqn) = slot.owner().map(str::to_string) else {
            return;
        };
        if let Some(i) = self.index(port) {
            self.slots[i] = slot;
        }
        let owned = self.owned.entry(nqn).or_default();
        if !owned.contains(&port) {
            owned.push(port);
        }
    }

    /// `nqn` listens on `port` as `role` now. The port was handed out to `nqn` by
    /// [`Self::take`], or is `nqn`'s already, or free; a port of another NQN is left alone
    /// and is an error (two calls for one NQN raced its removal). A new host port replaces
    /// `nqn`'s old one, which is freed. A port outside the range (a subsystem SPDK had before
    /// the range changed) is recorded without a slot.
    pub fn commit(&mut self, nqn: &str, port: u16, role: Role) -> Result<(), PortConflict> {
        if let Some(owner) = self.slot(port).and_then(Slot::owner)
            && owner != nqn
        {
            return Err(PortConflict {
                port,
                nqn: nqn.to_string(),
                owner: owner.to_string(),
            });
        }
        let slot = match role {
            Role::Host => Slot::Host(nqn.to_string()),
            Role::Pipe => Slot::Pipe(nqn.to_string()),
        };
        self.hold(port, slot);
        let (this, other) = match role {
            Role::Host => (&mut self.host, &mut self.pipes),
            Role::Pipe => (&mut self.pipes, &mut self.host),
        };
        if other.get(nqn) == Some(&port) {
            other.remove(nqn);
        }
        if let Some(old) = this.insert(nqn.to_string(), port)
            && old != port
        {
            self.free(nqn, old);
        }
        Ok(())
    }

    /// Undo [`Self::take`]: `port` goes back to the end of the FIFO if it is still pending
    /// for `nqn` (a listener that failed, a subsystem that was not made). A committed port,
    /// or another NQN's, stays.
    pub fn abandon(&mut self, nqn: &str, port: u16) {
        if self.slot(port) == Some(&Slot::Pending(nqn.to_string())) {
            self.free(nqn, port);
        }
    }

    /// `nqn` no longer uses `port`, in whatever role: it is free again, last in the FIFO.
    /// Nothing happens when another NQN owns it.
    pub fn free(&mut self, nqn: &str, port: u16) {
        if let Some(owner) = self.slot(port).and_then(Slot::owner)
            && owner != nqn
        {
            return;
        }
        if let Some(owned) = self.owned.get_mut(nqn) {
            owned.retain(|p| *p != port);
            if owned.is_empty() {
                self.owned.remove(nqn);
            }
        }
        if self.host.get(nqn) == Some(&port) {
            self.host.remove(nqn);
        }
        if self.pipes.get(nqn) == Some(&port) {
            self.pipes.remove(nqn);
        }
        if let Some(i) = self.index(port) {
            self.slots[i] = Slot::Free;
            if !self.in_fifo[i] {
                self.in_fifo[i] = true;
                self.fifo.push_back(port);
            }
        }
    }

    /// `nqn`'s subsystem is gone: every port it holds (host, pipe, pending) is free again.
    pub fn free_all(&mut self, nqn: &str) {
        for p in self.owned.get(nqn).cloned().unwrap_or_default() {
            self.free(nqn, p);
        }
        self.host.remove(nqn);
        self.pipes.remove(nqn);
    }

    /// Take over what SPDK says `nqn` listens on, when this map does not know its host port
    /// (its creation was cancelled after the reactor made it): `host` becomes its host port,
    /// `pipes` its pipe ports, and any other port it holds is freed. A port another NQN owns
    /// is left to that NQN and reported.
    pub fn adopt(&mut self, nqn: &str, host: u16, pipes: &[u16]) -> Vec<PortConflict> {
        let mut conflicts = Vec::new();
        let keep: Vec<u16> = std::iter::once(host).chain(pipes.iter().copied()).collect();
        for p in self.owned.get(nqn).cloned().unwrap_or_default() {
            if !keep.contains(&p) {
                self.free(nqn, p);
            }
        }
        if let Err(c) = self.commit(nqn, host, Role::Host) {
            conflicts.push(c);
        }
        for p in pipes {
            if let Err(c) = self.commit(nqn, *p, Role::Pipe) {
                conflicts.push(c);
            }
        }
        conflicts
    }

    /// Checks the invariant (tests): each port has one owner, and the indexes agree with
    /// the slots.
    #[cfg(test)]
    fn check(&self) {
        let mut seen = HashSet::new();
        for (nqn, ports) in &self.owned {
            for p in ports {
                assert!(seen.insert(*p), "port {p} held twice");
                if let Some(s) = self.slot(*p) {
                    assert_eq!(s.owner(), Some(nqn.as_str()), "port {p}");
                }
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            let p = self.lo + u16::try_from(i).unwrap_or(u16::MAX);
            match s {
                Slot::Free => assert!(self.in_fifo[i], "free port {p} not in the FIFO"),
                Slot::Host(n) => assert_eq!(self.host.get(n), Some(&p)),
                Slot::Pipe(n) => assert_eq!(self.pipes.get(n), Some(&p)),
                Slot::Pending(n) => assert!(self.owned[n].contains(&p)),
            }
        }
        let queued: HashSet<u16> = self.fifo.iter().copied().collect();
        assert_eq!(queued.len(), self.fifo.len(), "a port twice in the FIFO");
        for (i, q) in self.in_fifo.iter().enumerate() {
            let p = self.lo + u16::try_from(i).unwrap_or(u16::MAX);
            assert_eq!(*q, queued.contains(&p), "in_fifo of {p}");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const A: &str = "nqn.a";
    const B: &str = "nqn.b";
    const C: &str = "nqn.c";

    fn none() -> HashSet<u16> {
        HashSet::new()
    }

    fn host(m: &mut PortMap, nqn: &str, preferred: Option<u16>) -> u16 {
        let p = m.take(nqn, Role::Host, preferred, &none()).unwrap();
        m.commit(nqn, p, Role::Host).unwrap();
        m.check();
        p
    }

    #[test]
    fn ports_go_round_robin_and_a_freed_port_comes_last() {
        let mut m = PortMap::new(&(10..=13));
        assert_eq!(host(&mut m, A, None), 10);
        assert_eq!(host(&mut m, B, None), 11);
        m.free_all(A);
        m.check();
        assert_eq!(m.host(A), None);
        // 12, 13, then the freed 10.
        assert_eq!(host(&mut m, C, None), 12);
        assert_eq!(host(&mut m, "nqn.d", None), 13);
        assert_eq!(host(&mut m, "nqn.e", None), 10);
        // Exhausted: a clear error naming the range.
        let e = m.take("nqn.f", Role::Host, None, &none()).unwrap_err();
        assert_eq!(e, NoFreePort { lo: 10, hi: 13 });
        assert!(e.to_string().contains("widen the listen port range"));
        m.check();
    }

    #[test]
    fn preferred_port_is_honoured_when_free_or_the_nqns_own() {
        let mut m = PortMap::new(&(10..=19));
        assert_eq!(host(&mut m, A, Some(15)), 15);
        // Another NQN does not get it: the next free port instead.
        assert_eq!(host(&mut m, B, Some(15)), 10);
        // The same NQN does (a subsystem made again after its raid was rebuilt).
        assert_eq!(host(&mut m, A, Some(15)), 15);
        // Without a preference, the NQN's own host port.
        assert_eq!(host(&mut m, A, None), 15);
        // Outside the range: ignored.
        assert_eq!(host(&mut m, C, Some(99)), 11);
        // The stale FIFO entry of 15 is skipped.
        let order: Vec<u16> = (0..7)
            .map(|i| host(&mut m, &format!("n{i}"), None))
            .collect();
        assert_eq!(order, vec![12, 13, 14, 16, 17, 18, 19]);
    }

    #[test]
    fn tried_ports_are_passed_over_and_keep_their_turn() {
        let mut m = PortMap::new(&(10..=14));
        let tried: HashSet<u16> = [10, 11].into();
        let p = m.take(A, Role::Host, Some(10), &tried).unwrap();
        assert_eq!(p, 12);
        m.check();
        // A failed listen: the port goes to the back, and the call tries another.
        m.abandon(A, p);
        m.check();
        let tried: HashSet<u16> = [10, 11, 12].into();
        assert_eq!(m.take(A, Role::Host, None, &tried).unwrap(), 13);
        m.commit(A, 13, Role::Host).unwrap();
        // Another call has no tried ports: 10 and 11 kept their turn, 12 is last.
        assert_eq!(host(&mut m, B, None), 10);
        assert_eq!(host(&mut m, C, None), 11);
        assert_eq!(host(&mut m, "nqn.d", None), 14);
        assert_eq!(host(&mut m, "nqn.e", None), 12);
        // Everything tried: exhausted.
        m.free_all(B);
        let all: HashSet<u16> = (10..=14).collect();
        assert!(m.take("nqn.f", Role::Host, None, &all).is_err());
        m.check();
    }

    #[test]
    fn a_cancelled_take_stays_pending_for_its_nqn_until_settled() {
        let mut m = PortMap::new(&(10..=12));
        // Taken, then the call was dropped before its commit.
        assert_eq!(m.take(A, Role::Host, None, &none()).unwrap(), 10);
        m.check();
        assert_eq!(m.host(A), None, "not served yet");
        // Nobody else gets it.
        assert_eq!(host(&mut m, B, None), 11);
        // A's next export reuses it.
        assert_eq!(host(&mut m, A, None), 10);
        // A cancelled pipe take of A, then A's removal: every port of A free again.
        assert_eq!(m.take(A, Role::Pipe, None, &none()).unwrap(), 12);
        m.free_all(A);
        m.check();
        assert_eq!(host(&mut m, C, None), 10);
        assert_eq!(host(&mut m, "nqn.d", None), 12);
    }

    #[test]
    fn adopting_what_spdk_made_for_a_cancelled_create() {
        let mut m = PortMap::new(&(10..=19));
        let p = m.take(A, Role::Host, None, &none()).unwrap();
        let q = m.take(A, Role::Host, None, &none()).unwrap();
        assert_eq!(p, q, "the pending port is reused by the same NQN");
        let stray = m.take(A, Role::Pipe, None, &none()).unwrap();
        // SPDK made A on p with a pipe on 15; the stray pending port is not listened on.
        assert!(m.adopt(A, p, &[15]).is_empty());
        m.check();
        assert_eq!((m.host(A), m.pipe(A)), (Some(p), Some(15)));
        assert!(m.usable_by(stray, B, Role::Host), "the stray port is free");
        // A port another NQN owns stays with it.
        let b = host(&mut m, B, None);
        let c = m.adopt(C, b, &[]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].owner, B);
        assert_eq!(m.host(B), Some(b));
        m.check();
    }

    #[test]
    fn pipes_never_take_a_host_port_and_are_freed_with_their_nqn() {
        let mut m = PortMap::new(&(10..=13));
        let h = host(&mut m, A, None);
        let p = m.take(A, Role::Pipe, Some(h), &none()).unwrap();
        assert_ne!(p, h);
        m.commit(A, p, Role::Pipe).unwrap();
        m.check();
        assert_eq!((m.host(A), m.pipe(A)), (Some(h), Some(p)));
        // The pipe goes (migration done): only its port is freed.
        m.free(A, p);
        m.check();
        assert_eq!((m.host(A), m.pipe(A)), (Some(h), None));
        // Another NQN cannot free or commit A's port.
        m.free(B, h);
        assert_eq!(m.host(A), Some(h));
        assert!(m.commit(B, h, Role::Host).is_err());
        m.check();
    }

    #[test]
    fn a_new_host_port_replaces_the_old_one() {
        let mut m = PortMap::new(&(10..=12));
        assert_eq!(host(&mut m, A, None), 10);
        assert_eq!(host(&mut m, A, Some(12)), 12);
        assert_eq!(m.host(A), Some(12));
        assert_eq!(host(&mut m, B, None), 11);
        assert_eq!(host(&mut m, C, None), 10, "A's old port was freed");
    }

    #[test]
    fn many_exports_keep_one_owner_per_port() {
        let mut m = PortMap::new(&(1000..=1999));
        for round in 0..3 {
            for i in 0..1000 {
                let nqn = format!("n{round}-{i}");
                let p = m.take(&nqn, Role::Host, None, &none()).unwrap();
                m.commit(&nqn, p, Role::Host).unwrap();
            }
            assert!(m.take("x", Role::Host, None, &none()).is_err());
            m.abandon("x", 0);
            for i in (0..1000).step_by(2) {
                m.free_all(&format!("n{round}-{i}"));
            }
            for i in (1..1000).step_by(2) {
                m.free_all(&format!("n{round}-{i}"));
            }
            m.check();
        }
        assert!(m.host.is_empty() && m.owned.is_empty());
    }
}
