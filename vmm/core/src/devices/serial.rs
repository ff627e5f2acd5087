//! 16550 UART (vm-superio's model) whose output goes to stdout, a file, a Unix socket or nowhere.
//! Its interrupt line is an irqfd on the configured IOAPIC pin.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use vm_superio::{Serial, Trigger};
use vmm_config::SerialOutput;
use vmm_sys_util::eventfd::EventFd;

use crate::hooks::{Device, DeviceError, ExitContext, HookKey, Outcome, Request};
use crate::VmError;

use super::DeviceEnv;

/// Raises the UART's interrupt line through an irqfd.
struct IrqLine(EventFd);

impl Trigger for IrqLine {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Output kept for clients that connect to the socket late.
const SOCKET_BACKLOG: usize = 64 * 1024;

#[derive(Default)]
struct SocketClients {
    clients: Vec<UnixStream>,
    backlog: VecDeque<u8>,
}

/// Streams serial output to every client of a Unix socket; a slow or gone client is dropped
/// rather than allowed to stall the vCPU.
struct SocketSink(Arc<Mutex<SocketClients>>);

impl SocketSink {
    fn listen(path: &Path) -> io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let shared = Arc::new(Mutex::new(SocketClients::default()));
        let for_thread = shared.clone();
        std::thread::Builder::new().name("serial-socket".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut state = for_thread.lock().unwrap();
                let (a, b) = state.backlog.as_slices();
                let mut stream = stream;
                if stream.write_all(a).and_then(|_| stream.write_all(b)).is_ok() {
                    let _ = stream.set_nonblocking(true);
                    state.clients.push(stream);
                }
            }
        })?;
        Ok(SocketSink(shared))
    }
}

impl Write for SocketSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut state = self.0.lock().unwrap();
        state.backlog.extend(buf);
        let excess = state.backlog.len().saturating_sub(SOCKET_BACKLOG);
        state.backlog.drain(..excess);
        state.clients.retain_mut(|c| c.write_all(buf).is_ok());
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn sink(output: &SerialOutput) -> io::Result<Box<dyn Write + Send>> {
    Ok(match output {
        SerialOutput::Stdout => Box::new(io::stdout()),
        SerialOutput::Null => Box::new(io::sink()),
        SerialOutput::File(path) => Box::new(File::create(path)?),
        SerialOutput::UnixSocket(path) => Box::new(SocketSink::listen(path)?),
    })
}

struct Uart {
    serial: Serial<IrqLine, vm_superio::serial::NoEvents, Box<dyn Write + Send>>,
}

impl Device for Uart {
    fn handle(&mut self, _: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::PortRead { offset, data } => {
                data.fill(0);
                data[0] = self.serial.read(offset as u8);
            }
            Request::PortWrite { offset, data } => {
                // Output errors (a closed file, a full disk) must not kill the guest.
                let _ = self.serial.write(offset as u8, data[0]);
                if offset == 0 {
                    let _ = self.serial.writer_mut().flush();
                }
            }
            other => return Err(DeviceError(format!("serial cannot handle {other:?}"))),
        }
        Ok(Outcome::Continue)
    }
}

pub fn create(name: &str, port: u16, irq: u32, output: &SerialOutput, env: &mut DeviceEnv<'_>) -> Result<(), VmError> {
    let out = sink(output).map_err(|e| VmError::Config(format!("device.{name}.output: {e}")))?;
    let line = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmError::Kvm(format!("serial eventfd: {e}")))?;
    env.vm.register_irqfd(&line, irq).map_err(|e| VmError::Kvm(format!("serial irqfd on GSI {irq}: {e}")))?;
    let uart = Uart { serial: Serial::new(IrqLine(line), out) };
    env.hook_all(name, &[HookKey::Port { base: port, len: 8 }], uart)
}
