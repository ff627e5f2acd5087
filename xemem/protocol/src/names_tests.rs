//! One name space: name servers that share a name table (the host's broker and the daemon's
//! node), and every enclave of a tree behind the name server.

use crate::ids::*;
use crate::names::*;
use crate::nameserver::*;
use crate::network_tests::Net;
use crate::node::*;
use crate::tests::Rng;
use crate::wire::Name;
use crate::*;
use std::boxed::Box;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::vec::Vec;

/// A table several name servers share, as the daemon shares one between its broker and its
/// node (one lock around each step).
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Names>>);

impl NameTable for Shared {
    fn claim(&mut self, name: &Name, segment: SegmentId) -> Result<(), Error> {
        self.0.lock().unwrap().claim(name, segment)
    }
    fn release(&mut self, name: &Name, segment: SegmentId) {
        self.0.lock().unwrap().release(name, segment)
    }
    fn lookup(&self, name: &Name) -> Option<SegmentId> {
        self.0.lock().unwrap().lookup(name)
    }
}

fn name(text: &str) -> Name {
    Name::new(text.as_bytes()).unwrap()
}

fn anyone() -> Owner {
    Owner { uid: 0, gid: 0, mode: 0o666 }
}

fn sharing(servers: usize) -> Vec<NameServer> {
    let table = Shared::default();
    (0..servers)
        .map(|i| {
            let mut ns = NameServer::new(0x5eed + i as u64);
            assert!(ns.share_names(Box::new(table.clone())).is_empty());
            ns
        })
        .collect()
}

#[test]
fn a_name_is_held_by_its_first_segment_until_that_segment_lets_go() {
    let (first, second) = (SegmentId::new(2, 1).unwrap(), SegmentId::new(3, 1).unwrap());
    let mut names = Names::default();
    names.claim(&name("cg-solution"), first).unwrap();
    assert_eq!(names.claim(&name("cg-solution"), second), Err(Error::NameTaken));
    assert_eq!(names.claim(&name("cg-solution"), first), Err(Error::NameTaken), "never held twice");
    names.release(&name("cg-solution"), second);
    assert_eq!(names.lookup(&name("cg-solution")), Some(first), "only its holder lets a name go");
    names.release(&name("cg-solution"), first);
    assert_eq!(names.lookup(&name("cg-solution")), None);
    names.claim(&name("cg-solution"), second).unwrap();
    assert_eq!(names.lookup(&name("cg-solution")), Some(second));
}

/// The hijack of issue 22: a host process (the broker's name server) makes `cg-solution`,
/// then an enclave's job (the node's) makes it too; with two name spaces both succeeded and
/// each side's lookup found its own.
#[test]
fn the_second_make_of_a_held_name_fails_at_any_name_server_sharing_the_table() {
    let mut servers = sharing(2);
    let attacker = Principal { enclave: NAME_SERVER_ENCLAVE, process: 4242 };
    let root_job = Principal { enclave: 7, process: 1 };
    let held = servers[0].make(attacker, 0x1000, 0x1000, anyone(), Some(name("cg-solution"))).unwrap();
    assert_eq!(servers[1].make(root_job, 0x1000, 0x1000, anyone(), Some(name("cg-solution"))), Err(Error::NameTaken));
    assert_eq!(servers[1].segment_count(), 0, "the refused make left nothing behind");
    for ns in &servers {
        assert_eq!(ns.lookup(&name("cg-solution")), Ok(held));
    }
    // Its owner's remove frees the name everywhere; then the other side may have it.
    servers[0].remove(attacker, held).unwrap();
    let theirs = servers[1].make(root_job, 0x1000, 0x1000, anyone(), Some(name("cg-solution"))).unwrap();
    assert_eq!(servers[0].lookup(&name("cg-solution")), Ok(theirs));
    // An owner that goes (forget) or is removed by its host (remove_owned) frees it too.
    servers[1].forget_enclave(7);
    assert_eq!(servers[0].lookup(&name("cg-solution")), Err(Error::NotFound));
    let again = servers[0].make(attacker, 0x1000, 0x1000, anyone(), Some(name("cg-solution"))).unwrap();
    servers[0].remove_owned(|owner| *owner == attacker);
    assert_eq!(servers[1].lookup(&name("cg-solution")), Err(Error::NotFound), "{again:?} went with its owner");
}

#[test]
fn sharing_a_table_moves_a_servers_names_and_never_holds_one_twice() {
    let mut a = NameServer::new(1);
    let mut b = NameServer::new(2);
    let host = Principal { enclave: NAME_SERVER_ENCLAVE, process: 10 };
    let job = Principal { enclave: 5, process: 1 };
    let kept = a.make(host, 0x1000, 0x1000, anyone(), Some(name("both"))).unwrap();
    let only_a = a.make(host, 0x2000, 0x1000, anyone(), Some(name("only-a"))).unwrap();
    let loser = b.make(job, 0x1000, 0x1000, anyone(), Some(name("both"))).unwrap();
    let table = Shared::default();
    assert!(a.share_names(Box::new(table.clone())).is_empty());
    assert_eq!(b.share_names(Box::new(table.clone())), [loser]);
    for ns in [&a, &b] {
        assert_eq!(ns.lookup(&name("both")), Ok(kept));
        assert_eq!(ns.lookup(&name("only-a")), Ok(only_a));
    }
    assert_eq!(b.list(0, 10)[0].name, None, "the second holder lost its name");
    // Its remove must not take the name from the segment that holds it.
    b.remove(job, loser).unwrap();
    assert_eq!(a.lookup(&name("both")), Ok(kept));
}

/// Random makes, removes, owners going and lookups at three name servers sharing one table,
/// against a model of one name space: a make of a held name fails wherever it comes from,
/// and every lookup anywhere finds the segment the name was first given to.
#[test]
fn random_histories_at_name_servers_sharing_a_table_keep_one_name_space() {
    const NAMES: [&str; 5] = ["cg-solution", "a", "b", "c", "d"];
    for seed in 1..=40u64 {
        let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut servers = sharing(3);
        // Each server's principals are an enclave of their own, as the broker's and the node's.
        let principal = |server: usize, process: u64| Principal { enclave: 1 + server as u32, process };
        // name -> (server, owner, segment) holding it.
        let mut model: BTreeMap<&str, (usize, Principal, SegmentId)> = BTreeMap::new();
        for step in 0..400 {
            let server = rng.below(3) as usize;
            let label = NAMES[rng.below(NAMES.len() as u64) as usize];
            let owner = principal(server, 1 + rng.below(3));
            match rng.below(10) {
                0..=4 => {
                    let made = servers[server].make(owner, 0x1000, 0x1000, anyone(), Some(name(label)));
                    match model.get(label) {
                        Some(_) => assert_eq!(made, Err(Error::NameTaken), "seed {seed} step {step}: {label} is held"),
                        None => {
                            let segment = made.unwrap_or_else(|e| panic!("seed {seed} step {step}: {label} is free: {e:?}"));
                            model.insert(label, (server, owner, segment));
                        }
                    }
                }
                5..=6 => {
                    if let Some(&(at, holder, segment)) = model.get(label) {
                        // Another server cannot remove it: it does not know the segment.
                        let other = (at + 1 + rng.below(2) as usize) % 3;
                        assert_eq!(servers[other].remove(principal(other, holder.process), segment), Err(Error::NotFound));
                        servers[at].remove(holder, segment).unwrap();
                        model.remove(label);
                    }
                }
                7 => {
                    servers[server].forget(|p| *p == owner);
                    model.retain(|_, (at, holder, _)| !(*at == server && *holder == owner));
                }
                _ => {}
            }
            for label in NAMES {
                let expected = model.get(label).map(|(_, _, segment)| *segment).ok_or(Error::NotFound);
                for ns in &servers {
                    assert_eq!(ns.lookup(&name(label)), expected, "seed {seed} step {step}: lookup of {label}");
                }
            }
        }
    }
}

/// The same across a tree of enclaves (daemons and their enclaves), the name server at a
/// random one of them sharing its table with a host broker: every make, from any enclave of
/// the tree or from a host process, is decided at the root, so a name is held once in the
/// whole tree and a lookup from anywhere finds its first holder.
#[test]
fn a_name_is_held_once_across_a_tree_of_enclaves_and_the_host() {
    const NAMES: [&str; 3] = ["cg-solution", "x", "y"];
    for seed in [3u64, 11, 42] {
        let mut net = Net::tree(9, seed, 0, false);
        net.settle_ids();
        let root = net.nodes.iter().position(|n| n.name_server().is_some()).unwrap();
        let table = Shared::default();
        net.nodes[root].name_server_mut().unwrap().share_names(Box::new(table.clone()));
        let mut broker = NameServer::new(seed ^ 0xb0);
        broker.share_names(Box::new(table));
        let mut rng = Rng::new(seed | 1);
        // name -> (who: None for the broker, Some(node); owner process; segment).
        let mut model: BTreeMap<&str, (Option<usize>, u64, SegmentId)> = BTreeMap::new();
        for step in 0..120 {
            let label = NAMES[rng.below(NAMES.len() as u64) as usize];
            // The broker, or an enclave other than the name server's own.
            let who = match rng.below(net.nodes.len() as u64) as usize {
                node if node == root => None,
                node => Some(node),
            };
            let process = 1 + rng.below(4);
            if rng.below(3) < 2 {
                let made = match who {
                    None => broker.make(Principal { enclave: NAME_SERVER_ENCLAVE, process }, 0x1000, 0x1000, anyone(), Some(name(label))),
                    Some(node) => net
                        .call(node, Request::Make { process, vaddr: 0x1000, size: 0x1000, owner: anyone(), name: Some(name(label)) })
                        .map(|reply| match reply {
                            Reply::Made(segment) => segment,
                            other => panic!("make answered {other:?}"),
                        }),
                };
                match model.get(label) {
                    Some(_) => assert_eq!(made, Err(Error::NameTaken), "seed {seed} step {step}: {label} is held"),
                    None => {
                        model.insert(label, (who, process, made.unwrap()));
                    }
                }
            } else if let Some(&(holder, process, segment)) = model.get(label) {
                match holder {
                    None => assert!(broker.remove(Principal { enclave: NAME_SERVER_ENCLAVE, process }, segment).is_ok()),
                    Some(node) => assert_eq!(net.call(node, Request::Remove { process, segment }), Ok(Reply::Done)),
                }
                model.remove(label);
            }
            let expected = model.get(label).map(|(_, _, segment)| *segment);
            assert_eq!(broker.lookup(&name(label)).ok(), expected, "seed {seed} step {step}: the broker's lookup of {label}");
            let asker = rng.below(net.nodes.len() as u64) as usize;
            let found = net.call(asker, Request::Lookup { name: name(label) });
            let expected = expected.map(Reply::Found).ok_or(Error::NotFound);
            assert_eq!(found, expected, "seed {seed} step {step}: enclave {asker}'s lookup of {label}");
        }
    }
}
