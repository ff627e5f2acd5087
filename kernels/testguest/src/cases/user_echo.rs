//! `test=channel mode=poll-user`: the channel echo loop in ring 3.
//!
//! On PVM, ring-0 code is emulated instruction by instruction while ring-3 code runs natively,
//! so a ring-0 polling loop costs milliseconds per message and a ring-3 one what the hardware
//! costs. Only what the loop touches becomes user-accessible: its code and constants (the
//! linker script's user image: `.text.user`, `.rodata.user` and the channel crate), its stack,
//! and the channel region. Everything it calls is in that image or inlined; a stray access to
//! kernel memory is a page fault, reported like any other exception.

use clowder_channel::{Endpoint, RecvError, SendError};

use crate::arch::{self, user_mode};
use crate::paging::{self, UserAccess, UserMapError};

/// Messages the loop itself sends or recognises, in user-readable read-only data (string
/// literals would land in kernel-only `.rodata`).
#[link_section = ".rodata.user"]
static QUIT: [u8; 4] = *b"quit";
#[link_section = ".rodata.user"]
static BYE: [u8; 3] = *b"bye";
#[link_section = ".rodata.user"]
static MAP_REQUEST: [u8; 4] = *b"map ";
#[link_section = ".rodata.user"]
static MAP_REFUSED: [u8; 22] = *b"error map needs ring 0";

/// Why the ring-3 loop gave up.
#[derive(Clone, Copy, Debug)]
pub enum Failure {
    /// The user pages could not be set up.
    Map(UserMapError),
    Receive(RecvError),
    Send(SendError),
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Failure::Map(error) => write!(f, "cannot map the ring-3 loop: {:?}", error),
            Failure::Receive(error) => write!(f, "receive failed: {}", error),
            Failure::Send(error) => write!(f, "send failed: {}", error),
        }
    }
}

/// Everything the ring-3 loop uses, moved onto its stack; handed back when it returns.
struct EchoLoop {
    endpoint: Endpoint,
    doorbell_port: u16,
    /// Zeroed here, in ring 0: zeroing a local in ring 3 would call `memset` in kernel text.
    buffer: [u8; 256],
    echoed: u64,
    failure: Option<Failure>,
}

/// Serves echoes in ring 3 until `quit` (answered with `bye` from ring 3 too); returns the
/// number of messages echoed.
pub fn serve(endpoint: Endpoint, channel_gpa: u64, channel_size: u64, doorbell_port: u16) -> Result<u64, Failure> {
    let (image_start, image_end) = user_mode::user_image_range();
    let (stack_start, stack_end) = user_mode::user_stack_range();
    paging::allow_user_access(image_start, image_end, UserAccess::ReadOnly).map_err(Failure::Map)?;
    paging::allow_user_access(stack_start, stack_end, UserAccess::ReadWrite).map_err(Failure::Map)?;
    paging::allow_user_access(channel_gpa, channel_gpa + channel_size, UserAccess::ReadWrite).map_err(Failure::Map)?;
    // The doorbell is the one port the loop writes (PVM makes that a #GP the kernel completes).
    user_mode::permit_port_write(doorbell_port);
    let state = EchoLoop { endpoint, doorbell_port, buffer: [0; 256], echoed: 0, failure: None };
    let state = user_mode::run_in_user_mode(echo_in_ring3, state);
    match state.failure {
        Some(failure) => Err(failure),
        None => Ok(state.echoed),
    }
}

/// The loop itself, in ring 3. Same protocol as the ring-0 server: echo everything but `quit`;
/// `map` requests need the page tables, so they get an error reply instead.
#[link_section = ".text.user"]
extern "C" fn echo_in_ring3(state: &mut EchoLoop) -> ! {
    loop {
        let length = match state.endpoint.recv(&mut state.buffer) {
            Ok(Some(length)) => length,
            Ok(None) => {
                arch::pause();
                continue;
            }
            Err(error) => {
                state.failure = Some(Failure::Receive(error));
                user_mode::leave_user_mode()
            }
        };
        let message = &state.buffer[..length.min(state.buffer.len())];
        let mut send = |message: &[u8]| send_from_ring3(&mut state.endpoint, state.doorbell_port, message);
        let sent = if message == QUIT {
            send(&BYE).map(|()| user_mode::leave_user_mode())
        } else if message.starts_with(&MAP_REQUEST) {
            send(&MAP_REFUSED)
        } else {
            send(message).map(|()| state.echoed += 1)
        };
        if let Err(error) = sent {
            state.failure = Some(Failure::Send(error));
            user_mode::leave_user_mode()
        }
    }
}

/// Sends, spinning while the host's ring is full, then rings the doorbell if the host sleeps.
#[link_section = ".text.user"]
#[inline(never)]
fn send_from_ring3(endpoint: &mut Endpoint, doorbell_port: u16, message: &[u8]) -> Result<(), SendError> {
    loop {
        match endpoint.send(message) {
            Ok(()) => break,
            Err(SendError::Full) => arch::pause(),
            Err(error) => return Err(error),
        }
    }
    if endpoint.peer_waiting() {
        arch::outl(doorbell_port, 1);
    }
    Ok(())
}
