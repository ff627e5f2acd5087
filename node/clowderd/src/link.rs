//! The host end of an enclave channel: whole `enclave-proto` messages over the ring pair, with
//! the poll-then-sleep wake-up protocol (doorbell eventfd in, interrupt eventfd out).
//!
//! Sending and receiving use separate endpoints so a sender that waits for room never blocks
//! the receiver (which is what frees room when the guest is itself waiting to send). Each ring
//! still has one producer and one consumer: only [`Sender`] produces on host→guest, only
//! [`Receiver`] consumes guest→host.

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clowder_channel::{Channel, Endpoint, RecvError, SendError};
use enclave_proto::{Fragmenter, FrameError, HostMessage, Reassembler, MAX_MESSAGE_LEN};

use crate::guest_ram::GuestRam;
use crate::machine::ChannelParts;
use crate::sys;

/// How long a sender waits for the guest to make room before it gives up.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Sender {
    endpoint: Endpoint,
    interrupt: File,
    frame: Vec<u8>,
    message: Vec<u8>,
    /// Keeps the mapping the endpoint points into alive.
    _ram: Arc<GuestRam>,
}

pub struct Receiver {
    endpoint: Endpoint,
    doorbell: File,
    frame: Vec<u8>,
    assembly: Box<[u8]>,
    _ram: Arc<GuestRam>,
}

/// What the receiver got.
pub enum Received {
    Message(Vec<u8>),
    Nothing,
    /// The frames did not follow the framing rules; the partial message was dropped.
    BadFrame(FrameError),
}

/// Maps the enclave's RAM and attaches to its channel; returns both ends and the RAM mapping.
pub fn attach(parts: ChannelParts) -> Result<(Sender, Receiver, Arc<GuestRam>), String> {
    let channel_range = (parts.channel_gpa, parts.channel_size);
    let ram = Arc::new(GuestRam::map(&parts.memfd, parts.ram, channel_range).map_err(|e| format!("mapping enclave RAM: {e}"))?);
    let base = ram.host_address(parts.channel_offset, parts.channel_size).ok_or("the channel lies outside the enclave's memfd")?;
    // SAFETY: `base..base + size` lies inside the mapping `ram` holds, and both endpoints keep
    // `ram` alive; the guest shares the region, which the channel crate accesses atomically.
    let channel = unsafe { Channel::attach(base, parts.channel_size as usize) }.map_err(|e| format!("channel: {e}"))?;
    let sender_end = channel.host_end().map_err(|e| format!("channel: {e}"))?;
    let receiver_end = channel.host_end().map_err(|e| format!("channel: {e}"))?;
    let frame_len = sender_end.max_message_len();
    let sender = Sender {
        endpoint: sender_end,
        interrupt: parts.interrupt,
        frame: vec![0; frame_len],
        message: vec![0; MAX_MESSAGE_LEN],
        _ram: ram.clone(),
    };
    let receiver = Receiver {
        endpoint: receiver_end,
        doorbell: parts.doorbell,
        frame: vec![0; frame_len],
        assembly: vec![0; MAX_MESSAGE_LEN].into_boxed_slice(),
        _ram: ram.clone(),
    };
    Ok((sender, receiver, ram))
}

impl Sender {
    pub fn send(&mut self, message: &HostMessage<'_>) -> Result<(), String> {
        let length = message.encode(&mut self.message).map_err(|e| format!("encoding {message:?}: {e}"))?;
        let mut fragmenter = Fragmenter::new(&self.message[..length], self.frame.len()).map_err(|e| format!("framing: {e}"))?;
        while let Some(frame_len) = fragmenter.next_frame(&mut self.frame) {
            let deadline = Instant::now() + SEND_TIMEOUT;
            loop {
                match self.endpoint.send(&self.frame[..frame_len]) {
                    Ok(()) => break,
                    Err(SendError::Full) if Instant::now() < deadline => {
                        // The guest is behind: make sure it is awake, then give it a moment.
                        self.kick();
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Err(SendError::Full) => return Err("the enclave did not drain its channel for 5 s".into()),
                    Err(e) => return Err(format!("channel: {e}")),
                }
            }
            if self.endpoint.peer_waiting() {
                self.kick();
            }
        }
        Ok(())
    }

    /// Raises the channel interrupt in the guest with no message (a file slot's answer for a
    /// kernel that waits halted).
    pub fn kick(&self) {
        // An eventfd write fails only when its counter would overflow, which means the guest has
        // plenty of pending wake-ups already.
        let _ = sys::signal_eventfd(&self.interrupt);
    }
}

impl Receiver {
    /// A handle on the doorbell: signalling it wakes a [`Receiver::receive`] that is waiting,
    /// which then returns (`Nothing` when the enclave sent nothing).
    pub fn waker(&self) -> std::io::Result<File> {
        self.doorbell.try_clone()
    }

    /// Whether there is something to take without waiting: a frame in the ring, or a ring of
    /// the doorbell (a corrupt ring counts: [`Receiver::receive`] reports it).
    pub fn waiting(&mut self) -> bool {
        self.endpoint.has_message().unwrap_or(true) || sys::wait_readable(&self.doorbell, Duration::ZERO).unwrap_or(true)
    }

    /// Takes the next complete message, waiting up to `timeout` for one to start (poll first,
    /// then sleep on the doorbell). The frames of a message follow each other, so once one has
    /// started this waits for the rest, up to 5 s. Ring corruption is an error:
    /// nothing more from this channel can be trusted.
    ///
    /// A ring of the doorbell that brings no message (see [`Receiver::waker`]) ends the wait
    /// with `Nothing`, so the caller can serve whatever woke it.
    pub fn receive(&mut self, timeout: Duration) -> Result<Received, String> {
        let mut reassembler = Reassembler::new(&mut self.assembly);
        let mut started_at: Option<Instant> = None;
        let mut woken = false;
        loop {
            let length = match self.endpoint.recv(&mut self.frame) {
                Ok(Some(length)) => length,
                Ok(None) => {
                    match started_at {
                        None if woken => return Ok(Received::Nothing),
                        None if !sleep(&mut self.endpoint, &self.doorbell, timeout)? => return Ok(Received::Nothing),
                        None => woken = true,
                        Some(start) if start.elapsed() > SEND_TIMEOUT => {
                            return Err("the enclave started a message and did not finish it within 5 s".into())
                        }
                        Some(_) => {
                            sleep(&mut self.endpoint, &self.doorbell, Duration::from_millis(10))?;
                        }
                    }
                    continue;
                }
                Err(RecvError::BufferTooSmall { needed }) => return Err(format!("channel frame of {needed} bytes exceeds the slot")),
                Err(RecvError::Corrupt(corruption)) => return Err(format!("channel corrupted by the enclave: {corruption}")),
            };
            match reassembler.push(&self.frame[..length]) {
                Ok(Some(message)) => return Ok(Received::Message(message.to_vec())),
                Ok(None) => {
                    started_at.get_or_insert_with(Instant::now);
                }
                Err(error) => return Ok(Received::BadFrame(error)),
            }
        }
    }
}

/// Sleeps until the doorbell rings or `timeout` passes; false on timeout with nothing new.
fn sleep(endpoint: &mut Endpoint, doorbell: &File, timeout: Duration) -> Result<bool, String> {
    endpoint.set_waiting(true);
    // Look once more after announcing the sleep: a message may have landed in between, and its
    // sender saw no `waiting` flag, so rang no doorbell.
    let pending = endpoint.has_message().map_err(|e| format!("channel corrupted by the enclave: {e}"));
    let woken = match pending {
        Ok(true) => Ok(true),
        Ok(false) => sys::wait_readable(doorbell, timeout).map_err(|e| format!("doorbell: {e}")),
        Err(e) => Err(e),
    };
    endpoint.set_waiting(false);
    sys::drain_eventfd(doorbell);
    woken
}
