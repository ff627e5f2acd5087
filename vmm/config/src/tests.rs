//! End-to-end tests of the file format, the flags and validation, against a made-up host and
//! minimal kernel images in a temporary directory (no KVM, no hugepages needed).

use std::path::PathBuf;

use crate::args::draft_from_args;
use crate::file::parse_document;
use crate::host::test_images::{bzimage, elf64};
use crate::host::{HostFacts, HugePagePool};
use crate::test_support::TempDir;
use crate::validate::finish;
use crate::*;

/// A directory holding a PVH ELF kernel, a plain ELF kernel, a bzImage and two modules.
struct Fixture {
    dir: TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = TempDir::new();
        dir.write("kernel.elf", &elf64(62, true));
        dir.write("plain.elf", &elf64(62, false));
        dir.write("bzImage", &bzimage(0x020f, 1));
        dir.write("initrd.img", b"initrd");
        dir.write("extra.mod", b"module");
        Fixture { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Parses `text` as a file in the fixture directory and validates it on `host`.
    fn load_on(&self, text: &str, host: &HostFacts) -> Result<VmConfig, ConfigError> {
        finish(parse_document(text, self.dir.path(), "config")?, host)
    }

    fn load(&self, text: &str) -> Result<VmConfig, ConfigError> {
        self.load_on(text, &four_core_host())
    }

    /// `text` after a `[boot]` table naming the PVH kernel.
    fn load_with_kernel(&self, text: &str) -> Result<VmConfig, ConfigError> {
        self.load(&format!("[boot]\nkernel = \"kernel.elf\"\n{text}"))
    }

    /// Parses flags (file paths in them are used as given) and validates on the made-up host.
    fn args_on(&self, args: &[&str], host: &HostFacts) -> Result<VmConfig, ConfigError> {
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        finish(draft_from_args(&args)?, host)
    }

    fn args(&self, args: &[&str]) -> Result<VmConfig, ConfigError> {
        self.args_on(args, &four_core_host())
    }

    fn kernel_arg(&self) -> String {
        self.path("kernel.elf").display().to_string()
    }
}

fn four_core_host() -> HostFacts {
    HostFacts { usable_cpus: vec![0, 1, 2, 3], hugepages_2m: Some(HugePagePool { total: 0, free: 0 }) }
}

fn host_with_hugepages(total: u64, free: u64) -> HostFacts {
    HostFacts { hugepages_2m: Some(HugePagePool { total, free }), ..four_core_host() }
}

/// Asserts that `result` failed under `key` with a reason containing `fragment`.
#[track_caller]
fn assert_error(result: Result<VmConfig, ConfigError>, key: &str, fragment: &str) {
    match result {
        Ok(config) => panic!("expected {key}: ...{fragment}..., got {config:?}"),
        Err(error) => {
            assert_eq!(error.key, key, "wrong key in \"{error}\"");
            assert!(error.reason.contains(fragment), "\"{error}\" does not mention \"{fragment}\"");
            assert!(!error.to_string().contains('\n'), "\"{error}\" is not one line");
        }
    }
}

fn serial(name: &str, port: u16, output: SerialOutput) -> DeviceConfig {
    DeviceConfig { name: name.to_string(), kind: DeviceKind::Serial { port, irq: 4, output } }
}

// ---- valid files ----

#[test]
fn minimal_file_gets_the_documented_defaults() {
    let fixture = Fixture::new();
    let config = fixture.load("[boot]\nkernel = \"kernel.elf\"\n").unwrap();
    assert_eq!(
        config,
        VmConfig {
            memory: MemoryConfig { size: DEFAULT_MEMORY_SIZE, backing: Backing::Page4K },
            vcpus: vec![VcpuConfig { host_core: None }],
            boot: BootConfig {
                kernel: fixture.path("kernel.elf"),
                cmdline: String::new(),
                modules: vec![],
                protocol: BootProtocol::Auto,
                smp: SmpStart::Direct,
                unclaimed_ports: UnclaimedPorts::Auto,
            },
            devices: vec![
                serial("serial0", 0x3f8, SerialOutput::Stdout),
                DeviceConfig { name: "exit0".into(), kind: DeviceKind::Exit { port: 0xf4 } },
                DeviceConfig { name: "hypercall0".into(), kind: DeviceKind::Hypercall { port: 0x510 } },
                DeviceConfig { name: "channel0".into(), kind: DeviceKind::Channel { size: 64 << 10, doorbell_port: 0x520, vector: 0x40 } },
            ],
            watchdog_ms: None,
            control_socket: None,
        }
    );
}

const FULL_EXAMPLE: &str = r#"
[memory]
size = "64M"
backing = "2m"
[cpus]
count = 2
cores = [0, 1]
[boot]
kernel = "bzImage"
cmdline = "console=ttyS0"
modules = ["initrd.img"]
protocol = "auto"
smp = "sipi"
unclaimed_ports = "log"
[watchdog]
timeout = "5s"
[control]
socket = "vm0.sock"
[[device]]
name = "com1"
kind = "serial"
port = 0x3f8
irq = 4
output = "file:com1.log"
[[device]]
kind = "exit"
[[device]]
kind = "hypercall"
port = 0x600
[[device]]
name = "ring"
kind = "channel"
size = "128K"
port = 0x520
vector = 0x41
[[device]]
kind = "mmio-scratch"
base = 0xd000_0000
size = "8K"
[[device]]
kind = "msr-scratch"
msrs = [0x4b564d00, 0x4b564d01]
"#;

#[test]
fn full_example_file_is_read_as_written() {
    let fixture = Fixture::new();
    let config = fixture.load_on(FULL_EXAMPLE, &host_with_hugepages(32, 32)).unwrap();
    assert_eq!(config.memory, MemoryConfig { size: 64 << 20, backing: Backing::Huge2M });
    assert_eq!(config.vcpus, vec![VcpuConfig { host_core: Some(0) }, VcpuConfig { host_core: Some(1) }]);
    assert_eq!(
        config.boot,
        BootConfig {
            kernel: fixture.path("bzImage"),
            cmdline: "console=ttyS0".into(),
            modules: vec![fixture.path("initrd.img")],
            protocol: BootProtocol::Auto,
            smp: SmpStart::Sipi,
            unclaimed_ports: UnclaimedPorts::Log,
        }
    );
    assert_eq!(config.watchdog_ms, Some(5000));
    assert_eq!(config.control_socket, Some(fixture.path("vm0.sock")));
    let kinds: Vec<(&str, &DeviceKind)> = config.devices.iter().map(|device| (device.name.as_str(), &device.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            ("com1", &DeviceKind::Serial { port: 0x3f8, irq: 4, output: SerialOutput::File(fixture.path("com1.log")) }),
            ("exit0", &DeviceKind::Exit { port: 0xf4 }),
            ("hypercall0", &DeviceKind::Hypercall { port: 0x600 }),
            ("ring", &DeviceKind::Channel { size: 128 << 10, doorbell_port: 0x520, vector: 0x41 }),
            ("mmio-scratch0", &DeviceKind::MmioScratch { base: 0xd000_0000, size: 8192 }),
            ("msr-scratch0", &DeviceKind::MsrScratch { msrs: vec![0x4b56_4d00, 0x4b56_4d01] }),
        ]
    );
}

#[test]
fn written_configuration_reads_back_equal() {
    let fixture = Fixture::new();
    let host = host_with_hugepages(32, 32);
    let config = fixture.load_on(FULL_EXAMPLE, &host).unwrap();
    let text = config.to_toml_string();
    assert_eq!(fixture.load_on(&text, &host), Ok(config), "written as:\n{text}");

    let config = fixture
        .load("device = []\n[boot]\nkernel = \"kernel.elf\"\ncmdline = \"quote \\\" and \\\\\"\n[watchdog]\ntimeout = \"250ms\"\n")
        .unwrap();
    assert!(config.devices.is_empty());
    assert_eq!(config.boot.cmdline, "quote \" and \\");
    let text = config.to_toml_string();
    assert_eq!(fixture.load(&text), Ok(config), "written as:\n{text}");
}

#[test]
fn relative_paths_resolve_against_the_base_directory() {
    let fixture = Fixture::new();
    let absolute = fixture.path("initrd.img");
    let config = fixture.load_with_kernel(&format!("modules = [\"extra.mod\", \"{}\"]\n", absolute.display())).unwrap();
    assert_eq!(config.boot.modules, vec![fixture.path("extra.mod"), absolute]);
}

#[test]
fn from_file_resolves_paths_against_the_file_directory() {
    let fixture = Fixture::new();
    let path = fixture.dir.write("vm.toml", b"[boot]\nkernel = \"plain.elf\"\nprotocol = \"direct64\"\n");
    let config = VmConfig::from_file(&path).unwrap();
    assert_eq!(config.boot.kernel, fixture.path("plain.elf"));
    assert_eq!(config.boot.protocol, BootProtocol::Direct64);
}

#[test]
fn from_toml_str_validates_against_this_host() {
    let fixture = Fixture::new();
    let config = VmConfig::from_toml_str("[boot]\nkernel = \"kernel.elf\"\n", fixture.dir.path()).unwrap();
    assert_eq!(config.boot.kernel, fixture.path("kernel.elf"));
    assert_error(VmConfig::from_toml_str("[memory]\nsize = 1\n", fixture.dir.path()), "memory.size", "too small");
}

#[test]
fn from_args_validates_against_this_host() {
    let fixture = Fixture::new();
    let args = vec!["--kernel".to_string(), fixture.kernel_arg(), "--mem=16M".to_string()];
    let config = VmConfig::from_args(&args).unwrap();
    assert_eq!(config.memory.size, 16 << 20);
    assert_eq!(config.boot.kernel, fixture.path("kernel.elf"));
    assert!(VmConfig::from_args(&["--help".to_string()]).unwrap_err().is_help_request());
}

#[test]
fn from_file_reports_an_unreadable_file_under_its_path() {
    let fixture = Fixture::new();
    let missing = fixture.path("missing.toml");
    assert_error(VmConfig::from_file(&missing), &missing.display().to_string(), "cannot read the configuration");
}

#[test]
fn sizes_are_bytes_or_suffixed_and_may_exceed_3_gib() {
    let fixture = Fixture::new();
    let config = fixture.load_with_kernel("[memory]\nsize = 8388608\n").unwrap();
    assert_eq!(config.memory.size, 8 << 20);
    let config = fixture.load_with_kernel("[memory]\nsize = \"5G\"\n").unwrap();
    assert_eq!(config.memory.ram_ranges(), vec![0..3 << 30, 4 << 30..6 << 30]);
}

#[test]
fn enough_free_hugepages_allow_2m_backing() {
    let fixture = Fixture::new();
    let text = "[memory]\nsize = \"64M\"\nbacking = \"2m\"\n";
    let config = fixture.load_on(&format!("[boot]\nkernel = \"kernel.elf\"\n{text}"), &host_with_hugepages(40, 32));
    assert_eq!(config.unwrap().memory.backing, Backing::Huge2M);
}

#[test]
fn unnamed_devices_are_numbered_per_kind() {
    let fixture = Fixture::new();
    let config = fixture
        .load_with_kernel("[[device]]\nkind = \"serial\"\n[[device]]\nkind = \"serial\"\nport = 0x2f8\nirq = 3\noutput = \"null\"\n")
        .unwrap();
    let names: Vec<&str> = config.devices.iter().map(|device| device.name.as_str()).collect();
    assert_eq!(names, ["serial0", "serial1"]);
    assert_eq!(config.devices[1].kind, DeviceKind::Serial { port: 0x2f8, irq: 3, output: SerialOutput::Null });
    // A generated name never takes one given explicitly before it.
    let config = fixture
        .load_with_kernel("[[device]]\nname = \"serial1\"\nkind = \"serial\"\n[[device]]\nkind = \"serial\"\nport = 0x2f8\n")
        .unwrap();
    let names: Vec<&str> = config.devices.iter().map(|device| device.name.as_str()).collect();
    assert_eq!(names, ["serial1", "serial2"]);
}

#[test]
fn watchdog_off_and_pvh_protocol_are_accepted() {
    let fixture = Fixture::new();
    let config = fixture.load_with_kernel("protocol = \"pvh\"\n[watchdog]\ntimeout = \"off\"\n").unwrap();
    assert_eq!(config.boot.protocol, BootProtocol::Pvh);
    assert_eq!(config.watchdog_ms, None);
}

// ---- file errors: structure and types ----

#[test]
fn syntax_errors_give_the_position_on_one_line() {
    let fixture = Fixture::new();
    assert_error(fixture.load("[memory]\nsize = = 4\n"), "config", "line 2");
}

#[test]
fn unknown_keys_are_refused_in_every_table() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[network]\n"), "network", "unknown key (the file takes: memory");
    assert_error(fixture.load_with_kernel("[memory]\nsise = 4\n"), "memory.sise", "unknown key ([memory] takes: size, backing)");
    assert_error(fixture.load_with_kernel("[cpus]\ncores_ = []\n"), "cpus.cores_", "unknown key");
    assert_error(fixture.load_with_kernel("initrd = \"x\"\n"), "boot.initrd", "unknown key");
    assert_error(fixture.load_with_kernel("[watchdog]\nseconds = 5\n"), "watchdog.seconds", "unknown key");
    assert_error(fixture.load_with_kernel("[control]\npath = \"x\"\n"), "control.path", "unknown key");
}

#[test]
fn unknown_device_kinds_and_keys_are_refused() {
    let fixture = Fixture::new();
    assert_error(
        fixture.load_with_kernel("[[device]]\nname = \"u\"\nkind = \"uart\"\n"),
        "device.u.kind",
        "unknown device kind \"uart\" (kinds: serial, exit",
    );
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"serial\"\nvector = 0x40\n"),
        "device[0].vector",
        "unknown key for a serial device (it takes: name, kind, port, irq, output)",
    );
    assert_error(fixture.load_with_kernel("[[device]]\nname = \"x\"\n"), "device.x.kind", "missing");
}

#[test]
fn wrong_types_name_the_expected_type() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[memory]\nsize = true\n"), "memory.size", "expected a size");
    assert_error(fixture.load_with_kernel("[cpus]\ncount = \"2\"\n"), "cpus.count", "expected an integer, found string \"2\"");
    assert_error(fixture.load_with_kernel("[cpus]\ncount = 2\ncores = [0, \"a\"]\n"), "cpus.cores[1]", "expected an integer");
    assert_error(fixture.load_with_kernel("modules = \"initrd.img\"\n"), "boot.modules", "expected an array");
    assert_error(fixture.load("memory = 5\n"), "memory", "expected a table, found integer 5");
    assert_error(fixture.load_with_kernel("kernel = 3\n"), "config", "duplicate key");
    assert_error(fixture.load("[boot]\nkernel = 3\n"), "boot.kernel", "expected a string");
    assert_error(fixture.load("device = [1]\n[boot]\nkernel = \"kernel.elf\"\n"), "device[0]", "expected a table");
    assert_error(fixture.load_with_kernel("[[device]]\nkind = \"exit\"\nport = \"0xf4\"\n"), "device[0].port", "expected an integer");
}

#[test]
fn enumerated_values_list_the_choices() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[memory]\nbacking = \"1g\"\n"), "memory.backing", "expected \"4k\" or \"2m\"");
    assert_error(fixture.load_with_kernel("protocol = \"multiboot\"\n"), "boot.protocol", "auto, pvh, direct64 or linux");
    assert_error(fixture.load_with_kernel("smp = \"all\"\n"), "boot.smp", "direct or sipi");
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"serial\"\noutput = \"tty\"\n"),
        "device[0].output",
        "stdout, null, file:PATH or unix:PATH",
    );
}

// ---- file errors: memory ----

#[test]
fn memory_size_must_be_between_2_mib_and_1_tib() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[memory]\nsize = 0\n"), "memory.size", "0 bytes is too small: at least 2 MiB");
    assert_error(fixture.load_with_kernel("[memory]\nsize = \"1M\"\n"), "memory.size", "too small");
    assert_error(fixture.load_with_kernel("[memory]\nsize = \"2T\"\n"), "memory.size", "more than the 1 TiB limit");
    assert_error(fixture.load_with_kernel("[memory]\nsize = \"64 M\"\n"), "memory.size", "not a size");
    assert_error(fixture.load_with_kernel("[memory]\nsize = -4096\n"), "memory.size", "out of range");
}

#[test]
fn memory_size_must_be_a_multiple_of_the_page_size() {
    let fixture = Fixture::new();
    assert_error(
        fixture.load_with_kernel("[memory]\nsize = 4194305\n"),
        "memory.size",
        "4194305 bytes is not a multiple of the 4 KiB page size (memory.backing = \"4k\")",
    );
    assert_error(
        fixture.load_on("[boot]\nkernel = \"kernel.elf\"\n[memory]\nsize = \"3M\"\nbacking = \"2m\"\n", &host_with_hugepages(8, 8)),
        "memory.size",
        "3 MiB is not a multiple of the 2 MiB page size (memory.backing = \"2m\")",
    );
}

#[test]
fn hugepages_must_be_reserved_for_2m_backing() {
    let fixture = Fixture::new();
    let text = "[boot]\nkernel = \"kernel.elf\"\n[memory]\nsize = \"64M\"\nbacking = \"2m\"\n";
    let error = fixture.load_on(text, &host_with_hugepages(0, 0)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "memory.backing: 2m backing needs 32 free 2 MiB hugepages, 0 are free (reserve them with: sysctl vm.nr_hugepages=32)"
    );
    // Pages in use elsewhere stay in use: the pool must grow by the shortfall.
    assert_error(
        fixture.load_on(text, &host_with_hugepages(10, 1)),
        "memory.backing",
        "1 is free (reserve them with: sysctl vm.nr_hugepages=41)",
    );
    let no_pool = HostFacts { hugepages_2m: None, ..four_core_host() };
    assert_error(fixture.load_on(text, &no_pool), "memory.backing", "no 2 MiB hugepage pool");
}

// ---- file errors: vCPUs ----

#[test]
fn vcpu_count_must_be_1_to_255() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[cpus]\ncount = 0\n"), "cpus.count", "at least 1");
    assert_error(fixture.load_with_kernel("[cpus]\ncount = 256\n"), "cpus.count", "256 is more than 255 vCPUs");
    assert_eq!(fixture.load_with_kernel("[cpus]\ncount = 255\n").unwrap().vcpus.len(), 255);
}

#[test]
fn cores_must_match_the_count_and_exist() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[cpus]\ncount = 2\ncores = [0]\n"), "cpus.cores", "lists 1 cores for 2 vCPUs (cpus.count = 2)");
    assert_error(
        fixture.load_with_kernel("[cpus]\ncount = 2\ncores = [1, 7]\n"),
        "cpus.cores",
        "core 7 (for vCPU 1) is not present: not online or not in this process's CPU affinity (usable: 0-3)",
    );
    let config = fixture.load_with_kernel("[cpus]\ncount = 3\ncores = [3, 3, 0]\n").unwrap();
    let cores: Vec<Option<usize>> = config.vcpus.iter().map(|vcpu| vcpu.host_core).collect();
    assert_eq!(cores, [Some(3), Some(3), Some(0)]);
}

/// Sizes and core lists are spelled as everywhere in clowder (the `hwspec` crate), the same in
/// the file and in flags: `256MiB` and `256M`, `"0-1"` and `[0, 1]`.
#[test]
fn sizes_and_core_lists_read_alike_in_the_file_and_the_flags() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel_arg();
    let cores = |config: VmConfig| -> Vec<Option<usize>> { config.vcpus.iter().map(|vcpu| vcpu.host_core).collect() };
    for text in [
        "[memory]\nsize = \"256MiB\"\n[cpus]\ncount = 2\ncores = \"2-3\"\n",
        "[memory]\nsize = \"256M\"\n[cpus]\ncount = 2\ncores = [2, 3]\n",
    ] {
        let config = fixture.load_with_kernel(text).unwrap();
        assert_eq!(config.memory.size, 256 << 20, "{text}");
        assert_eq!(cores(config), [Some(2), Some(3)], "{text}");
    }
    let config = fixture.args(&["--kernel", &kernel, "--mem", "256MiB", "--cpus", "2", "--cores", "2-3"]).unwrap();
    assert_eq!(config.memory.size, 256 << 20);
    assert_eq!(cores(config), [Some(2), Some(3)]);

    assert_error(
        fixture.load_with_kernel("[memory]\nsize = \"256MB\"\n"),
        "memory.size",
        "\"256MB\" is not a size: KB, MB, GB and TB are ambiguous",
    );
    assert_error(
        fixture.args(&["--kernel", &kernel, "--mem", "256MB"]),
        "--mem",
        "\"256MB\" is not a size: KB, MB, GB and TB are ambiguous",
    );
    assert_error(
        fixture.load_with_kernel("[cpus]\ncount = 2\ncores = \"1,1\"\n"),
        "cpus.cores",
        "\"1,1\" is not a CPU list: CPU 1 is listed twice",
    );
    assert_error(
        fixture.args(&["--kernel", &kernel, "--cpus", "2", "--cores", "1,1"]),
        "--cores",
        "\"1,1\" is not a CPU list: CPU 1 is listed twice",
    );
    assert_error(fixture.load_with_kernel("[cpus]\ncores = \"3-1\"\n"), "cpus.cores", "the range 3-1 goes down");
    assert_error(
        fixture.load_with_kernel("[cpus]\ncores = 1\n"),
        "cpus.cores",
        "expected an array or a CPU list string such as \"0-3\", found integer 1",
    );
}

// ---- file errors: boot ----

#[test]
fn kernel_must_be_given_and_readable() {
    let fixture = Fixture::new();
    assert_error(fixture.load(""), "boot.kernel", "missing");
    assert_error(fixture.load("[boot]\nkernel = \"nope.elf\"\n"), "boot.kernel", "cannot open");
    assert_error(fixture.load("[boot]\nkernel = \".\"\n"), "boot.kernel", "is a directory");
}

#[test]
fn kernel_must_be_an_x86_64_elf64_or_a_64_bit_bzimage() {
    let fixture = Fixture::new();
    fixture.dir.write("script", b"#!/bin/sh\necho hi\n");
    fixture.dir.write("arm64.elf", &elf64(183, false));
    fixture.dir.write("old-bzImage", &bzimage(0x0205, 1));
    fixture.dir.write("32-bit-bzImage", &bzimage(0x020f, 0));
    assert_error(fixture.load("[boot]\nkernel = \"script\"\n"), "boot.kernel", "neither an ELF64 x86-64 kernel nor a bzImage");
    assert_error(fixture.load("[boot]\nkernel = \"arm64.elf\"\n"), "boot.kernel", "not x86-64");
    assert_error(fixture.load("[boot]\nkernel = \"old-bzImage\"\n"), "boot.kernel", "at least 2.06");
    assert_error(fixture.load("[boot]\nkernel = \"32-bit-bzImage\"\n"), "boot.kernel", "without a 64-bit entry point");
    let mut corrupt = elf64(62, true);
    corrupt[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
    fixture.dir.write("corrupt.elf", &corrupt);
    assert_error(fixture.load("[boot]\nkernel = \"corrupt.elf\"\n"), "boot.kernel", "cannot read the program headers");
}

#[test]
fn protocol_must_suit_the_kernel() {
    let fixture = Fixture::new();
    assert_error(fixture.load("[boot]\nkernel = \"plain.elf\"\nprotocol = \"pvh\"\n"), "boot.protocol", "has no PVH entry note");
    assert_error(fixture.load("[boot]\nkernel = \"bzImage\"\nprotocol = \"direct64\"\n"), "boot.protocol", "is a bzImage, not an ELF64");
    assert_error(fixture.load("[boot]\nkernel = \"kernel.elf\"\nprotocol = \"linux\"\n"), "boot.protocol", "is an ELF64, not a bzImage");
    assert!(fixture.load("[boot]\nkernel = \"kernel.elf\"\nprotocol = \"direct64\"\n").is_ok());
    assert!(fixture.load("[boot]\nkernel = \"bzImage\"\nprotocol = \"linux\"\n").is_ok());
}

#[test]
fn modules_must_exist_and_a_linux_boot_takes_one() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("modules = [\"initrd.img\", \"gone.img\"]\n"), "boot.modules[1]", "cannot open");
    assert_error(
        fixture.load("[boot]\nkernel = \"bzImage\"\nmodules = [\"initrd.img\", \"extra.mod\"]\n"),
        "boot.modules[1]",
        "a Linux boot takes one module (the initrd), 2 are given",
    );
    assert_eq!(fixture.load_with_kernel("modules = [\"initrd.img\", \"extra.mod\"]\n").unwrap().boot.modules.len(), 2);
    let modules = vec!["\"extra.mod\""; 63].join(", ");
    assert_error(
        fixture.load_with_kernel(&format!("modules = [{modules}]\n")),
        "boot.modules[62]",
        "63 modules given, the PVH module list holds at most 62",
    );
}

#[test]
fn cmdline_keeps_headroom_for_the_vmm_keys() {
    let fixture = Fixture::new();
    let longest = "a".repeat(3839);
    assert!(fixture.load_with_kernel(&format!("cmdline = \"{longest}\"\n")).is_ok());
    assert_error(
        fixture.load_with_kernel(&format!("cmdline = \"{longest}b\"\n")),
        "boot.cmdline",
        "is 3840 bytes, at most 3839 are allowed: the limit is 4095 and 256 bytes are kept for the clowder.* keys the VMM appends",
    );
    assert_error(fixture.load_with_kernel("cmdline = \"a\\u0000b\"\n"), "boot.cmdline", "NUL");
}

#[test]
fn watchdog_needs_a_unit_and_a_positive_time() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[watchdog]\ntimeout = \"5\"\n"), "watchdog.timeout", "needs a unit");
    assert_error(fixture.load_with_kernel("[watchdog]\ntimeout = 5\n"), "watchdog.timeout", "expected a string");
    assert_error(fixture.load_with_kernel("[watchdog]\ntimeout = \"0ms\"\n"), "watchdog.timeout", "longer than 0");
}

// ---- file errors: devices ----

#[test]
fn device_port_ranges_must_not_overlap() {
    let fixture = Fixture::new();
    assert_error(
        fixture.load_with_kernel(
            "[[device]]\nname = \"com1\"\nkind = \"serial\"\n[[device]]\nname = \"off\"\nkind = \"exit\"\nport = 0x3fc\n",
        ),
        "device.off.port",
        "ports 0x3fc..=0x3ff overlap ports 0x3f8..=0x3ff of \"com1\"",
    );
    assert_error(
        fixture.load_with_kernel(
            "[[device]]\nname = \"h\"\nkind = \"hypercall\"\nport = 0x50e\n[[device]]\nkind = \"channel\"\nport = 0x511\n",
        ),
        "device.channel0.port",
        "overlap ports 0x50e..=0x511 of \"h\"",
    );
    assert!(fixture
        .load_with_kernel("[[device]]\nkind = \"exit\"\nport = 0x500\n[[device]]\nkind = \"hypercall\"\nport = 0x504\n")
        .is_ok());
}

#[test]
fn device_ports_must_avoid_ports_kvm_or_the_vmm_handle() {
    let fixture = Fixture::new();
    let exit_at = |port: &str| fixture.load_with_kernel(&format!("[[device]]\nname = \"e\"\nkind = \"exit\"\nport = {port}\n"));
    assert_error(exit_at("0x40"), "device.e.port", "ports 0x40..=0x43 overlap the in-kernel PIT");
    assert_error(exit_at("0x1e"), "device.e.port", "overlap the in-kernel PIC (0x20..=0x21)");
    assert_error(exit_at("0x7e"), "device.e.port", "overlap the POST-code port the VMM ignores");
    assert_error(exit_at("0x4cf"), "device.e.port", "ELCR");
    assert_error(exit_at("0x60"), "device.e.port", "speaker");
    assert!(exit_at("0x44").is_ok());
}

#[test]
fn device_ports_must_fit_in_the_port_space() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[[device]]\nkind = \"exit\"\nport = 70000\n"), "device[0].port", "out of range 0x0..=0xffff");
    assert_error(
        fixture.load_with_kernel("[[device]]\nname = \"com\"\nkind = \"serial\"\nport = 0xfffc\n"),
        "device.com.port",
        "ports 0xfffc..=0x10003 run past 0xffff",
    );
}

#[test]
fn device_names_must_be_unique_and_plain() {
    let fixture = Fixture::new();
    assert_error(
        fixture.load_with_kernel("[[device]]\nname = \"a\"\nkind = \"serial\"\n[[device]]\nname = \"a\"\nkind = \"exit\"\n"),
        "device.a.name",
        "two devices are named \"a\"",
    );
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"serial\"\n[[device]]\nname = \"serial0\"\nkind = \"exit\"\n"),
        "device.serial0.name",
        "names must be unique",
    );
    assert_error(fixture.load_with_kernel("[[device]]\nname = \"a.b\"\nkind = \"exit\"\n"), "device[0].name", "only contain letters");
    assert_error(fixture.load_with_kernel("[[device]]\nname = \"\"\nkind = \"exit\"\n"), "device[0].name", "is empty");
}

#[test]
fn abi_devices_are_singletons() {
    let fixture = Fixture::new();
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"channel\"\n[[device]]\nkind = \"channel\"\nport = 0x530\n"),
        "device.channel1.kind",
        "at most one channel device, and \"channel0\" is one already",
    );
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"exit\"\n[[device]]\nname = \"x\"\nkind = \"exit\"\nport = 0x501\n"),
        "device.x.kind",
        "at most one exit device",
    );
}

#[test]
fn serial_irq_must_be_an_ioapic_pin() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[[device]]\nkind = \"serial\"\nirq = 24\n"), "device[0].irq", "out of range 0x0..=0x17");
}

#[test]
fn channel_vector_size_and_placement_are_checked() {
    let fixture = Fixture::new();
    let channel = |keys: &str| fixture.load_with_kernel(&format!("[[device]]\nname = \"ch\"\nkind = \"channel\"\n{keys}"));
    assert_error(channel("vector = 0x1f\n"), "device.ch.vector", "0x1f is a CPU exception vector; use 0x20..=0xff");
    assert_error(channel("vector = 0x100\n"), "device.ch.vector", "out of range");
    assert_error(channel("size = 5000\n"), "device.ch.size", "not a multiple of 4 KiB");
    assert_error(channel("size = \"8K\"\n"), "device.ch.size", "at least 12 KiB");
    assert_error(
        fixture.load_with_kernel("[memory]\nsize = \"2M\"\n"),
        "device.channel0.size",
        "64 KiB does not fit at the top of low RAM (2 MiB)",
    );
}

#[test]
fn mmio_windows_stay_clear_of_ram_apics_and_each_other() {
    let fixture = Fixture::new();
    let window = |base: &str| {
        fixture.load_with_kernel(&format!(
            "[memory]\nsize = \"4G\"\n[[device]]\nname = \"w\"\nkind = \"mmio-scratch\"\nbase = {base}\nsize = 0x2000\n"
        ))
    };
    assert_error(window("0x1000"), "device.w.base", "MMIO window 0x1000..0x3000 overlaps guest RAM 0x0..0xc0000000");
    assert_error(window("0x100000000"), "device.w.base", "overlaps guest RAM 0x100000000..0x140000000");
    assert_error(window("0xfedff000"), "device.w.base", "overlaps the LAPIC at 0xfee00000");
    assert_error(window("0xfec00800"), "device.w.base", "overlaps the IOAPIC at 0xfec00000");
    assert!(window("0xd0000000").is_ok());
    assert_error(
        fixture.load_with_kernel(
            "[[device]]\nname = \"a\"\nkind = \"mmio-scratch\"\nbase = 0xd0000000\n[[device]]\nname = \"b\"\nkind = \"mmio-scratch\"\nbase = 0xd0000800\n",
        ),
        "device.b.base",
        "overlaps the MMIO window of \"a\"",
    );
    assert_error(fixture.load_with_kernel("[[device]]\nkind = \"mmio-scratch\"\n"), "device[0].base", "missing");
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"mmio-scratch\"\nbase = 0xd0000000\nsize = 0\n"),
        "device[0].size",
        "more than 0",
    );
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"mmio-scratch\"\nbase = 0xfffffffff0000\nsize = \"1M\"\n"),
        "device[0].size",
        "ends past the 52-bit guest-physical address space",
    );
}

#[test]
fn msr_scratch_lists_distinct_msrs() {
    let fixture = Fixture::new();
    assert_error(fixture.load_with_kernel("[[device]]\nkind = \"msr-scratch\"\n"), "device[0].msrs", "missing");
    assert_error(fixture.load_with_kernel("[[device]]\nkind = \"msr-scratch\"\nmsrs = []\n"), "device[0].msrs", "is empty");
    assert_error(fixture.load_with_kernel("[[device]]\nkind = \"msr-scratch\"\nmsrs = [1, 1]\n"), "device[0].msrs", "lists MSR 0x1 twice");
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"msr-scratch\"\nmsrs = [0x100000000]\n"),
        "device[0].msrs[0]",
        "out of range",
    );
    assert_error(
        fixture.load_with_kernel("[[device]]\nkind = \"msr-scratch\"\nmsrs = [1, 2]\n[[device]]\nkind = \"msr-scratch\"\nmsrs = [3, 2]\n"),
        "device.msr-scratch1.msrs",
        "MSR 0x2 is handled by \"msr-scratch0\" already",
    );
}

#[test]
fn output_and_socket_directories_must_exist() {
    let fixture = Fixture::new();
    assert_error(
        fixture.load_with_kernel("[[device]]\nname = \"com1\"\nkind = \"serial\"\noutput = \"file:no/such/dir/com1.log\"\n"),
        "device.com1.output",
        "does not exist",
    );
    let long = format!("unix:/tmp/{}.sock", "s".repeat(100));
    assert_error(
        fixture.load_with_kernel(&format!("[[device]]\nname = \"com1\"\nkind = \"serial\"\noutput = \"{long}\"\n")),
        "device.com1.output",
        "a Unix socket path holds at most 107",
    );
    assert_error(fixture.load_with_kernel("[control]\nsocket = \"no/such/dir/vm.sock\"\n"), "control.socket", "does not exist");
}

// ---- the command line ----

#[test]
fn flags_alone_describe_a_vm() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel_arg();
    let log = fixture.path("com1.log").display().to_string();
    let config = fixture
        .args(&[
            "--kernel",
            &kernel,
            "--mem",
            "256M",
            "--cpus",
            "2",
            "--cores",
            "2-3",
            "--cmdline",
            "--verbose quiet",
            "--protocol",
            "pvh",
            "--smp=sipi",
            "--serial",
            &format!("file:{log}"),
            "--watchdog",
            "500ms",
            "--control",
            "/tmp/vm0.sock",
        ])
        .unwrap();
    assert_eq!(config.memory, MemoryConfig { size: 256 << 20, backing: Backing::Page4K });
    assert_eq!(config.vcpus, vec![VcpuConfig { host_core: Some(2) }, VcpuConfig { host_core: Some(3) }]);
    assert_eq!(config.boot.cmdline, "--verbose quiet");
    assert_eq!(config.boot.protocol, BootProtocol::Pvh);
    assert_eq!(config.boot.smp, SmpStart::Sipi);
    assert_eq!(config.devices[0], serial("serial0", 0x3f8, SerialOutput::File(log.into())));
    assert_eq!(config.watchdog_ms, Some(500));
    assert_eq!(config.control_socket, Some(PathBuf::from("/tmp/vm0.sock")));
}

#[test]
fn flags_override_the_config_file_wherever_it_appears() {
    let fixture = Fixture::new();
    let file = fixture.dir.write("vm.toml", FULL_EXAMPLE.as_bytes());
    let file = file.display().to_string();
    let kernel = fixture.kernel_arg();
    let extra = fixture.path("extra.mod").display().to_string();
    let initrd = fixture.path("initrd.img").display().to_string();
    let config = fixture
        .args(&[
            "--mem",
            "32M",
            "--backing",
            "4k",
            "--kernel",
            &kernel,
            "--module",
            &extra,
            "--module",
            &initrd,
            "--serial",
            "null",
            "--watchdog",
            "off",
            "--cpus",
            "1",
            "--cores",
            "3",
            "--config",
            &file,
        ])
        .unwrap();
    assert_eq!(config.memory, MemoryConfig { size: 32 << 20, backing: Backing::Page4K });
    assert_eq!(config.vcpus, vec![VcpuConfig { host_core: Some(3) }]);
    assert_eq!(config.boot.kernel, fixture.path("kernel.elf"));
    // --module replaces the file's list instead of adding to it.
    assert_eq!(config.boot.modules, vec![fixture.path("extra.mod"), fixture.path("initrd.img")]);
    assert_eq!(config.boot.cmdline, "console=ttyS0");
    assert_eq!(config.devices[0], serial("com1", 0x3f8, SerialOutput::Null));
    assert_eq!(config.devices.len(), 6);
    assert_eq!(config.watchdog_ms, None);
    assert_eq!(config.control_socket, Some(fixture.path("vm0.sock")));
}

#[test]
fn errors_found_after_merging_name_the_flag_that_set_the_value() {
    let fixture = Fixture::new();
    let file = fixture.dir.write("vm.toml", b"[boot]\nkernel = \"kernel.elf\"\n[memory]\nsize = \"3M\"\n");
    let file = file.display().to_string();
    assert_error(
        fixture.args_on(&["--config", &file, "--backing", "2m"], &host_with_hugepages(8, 8)),
        "memory.size",
        "not a multiple of the 2 MiB page size (--backing 2m)",
    );
    assert_error(fixture.args(&["--config", &file, "--mem", "64M", "--backing", "2m"]), "--backing", "needs 32 free 2 MiB hugepages");
    assert_error(fixture.args(&["--config", &file, "--mem", "1M"]), "--mem", "too small");
    assert_error(
        fixture.args(&["--config", &file, "--mem", "4M", "--cpus", "2", "--cores", "0"]),
        "--cores",
        "lists 1 cores for 2 vCPUs (--cpus 2)",
    );
    assert_error(fixture.args(&["--config", &file, "--mem", "4M", "--cores", "9"]), "--cores", "core 9 (for vCPU 0) is not present");
    assert_error(fixture.args(&["--config", &file, "--mem", "4M", "--kernel", "/nonexistent"]), "--kernel", "cannot open");
    assert_error(fixture.args(&["--config", &file, "--mem", "4M", "--module", "/nonexistent"]), "--module", "cannot open");
    assert_error(fixture.args(&["--config", &file, "--mem", "4M", "--protocol", "linux"]), "--protocol", "not a bzImage");
    assert_error(fixture.args(&["--config", &file, "--mem", "4M", "--cmdline", &"x".repeat(4000)]), "--cmdline", "at most 3839");
    assert_error(fixture.args(&["--config", &file, "--mem", "4M", "--control", "/no/such/dir/s"]), "--control", "does not exist");
    assert_error(fixture.args(&["--config", &file, "--mem", "4M", "--serial", "file:/no/such/dir/log"]), "--serial", "does not exist");
    assert_error(fixture.args(&["--config", &file, "--mem", "4M", "--cpus", "0"]), "--cpus", "at least 1");
}

#[test]
fn flag_values_are_checked_like_file_values() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel_arg();
    let with_kernel = |flag: &str, value: &str| fixture.args(&["--kernel", &kernel, flag, value]);
    assert_error(with_kernel("--mem", "6x"), "--mem", "\"6x\" is not a size");
    assert_error(with_kernel("--backing", "1g"), "--backing", "expected \"4k\" or \"2m\"");
    assert_error(with_kernel("--cpus", "two"), "--cpus", "\"two\" is not a vCPU count");
    assert_error(with_kernel("--cores", "0;1"), "--cores", "\"0;1\" is not a CPU list");
    assert_error(with_kernel("--protocol", "efi"), "--protocol", "auto, pvh, direct64 or linux");
    assert_error(with_kernel("--smp", "x"), "--smp", "direct or sipi");
    assert_error(with_kernel("--unclaimed-ports", "ignore"), "--unclaimed-ports", "auto, fail or log");
    assert_error(with_kernel("--serial", "tcp:80"), "--serial", "not a serial output");
    assert_error(with_kernel("--watchdog", "5"), "--watchdog", "needs a unit");
}

#[test]
fn malformed_command_lines_are_refused() {
    let fixture = Fixture::new();
    let kernel = fixture.kernel_arg();
    assert_error(fixture.args(&["--kernel", &kernel, "--memory", "64M"]), "--memory", "unknown flag");
    assert_error(fixture.args(&["--kernel", &kernel, "extra"]), "extra", "unexpected argument");
    assert_error(fixture.args(&["--kernel"]), "--kernel", "needs a value, e.g. --kernel kernel.elf");
    assert_error(fixture.args(&["--kernel", "--mem", "64M"]), "--kernel", "needs a value");
    assert_error(fixture.args(&["--kernel", &kernel, "--mem", "64M", "--mem=128M"]), "--mem", "given more than once");
    assert_error(fixture.args(&[]), "boot.kernel", "--kernel");
    let missing = fixture.path("missing.toml").display().to_string();
    assert_error(fixture.args(&["--config", &missing]), &missing, "cannot read the configuration");
    let no_devices = fixture.dir.write("bare.toml", b"device = []\n[boot]\nkernel = \"kernel.elf\"\n");
    assert_error(fixture.args(&["--config", &no_devices.display().to_string(), "--serial", "null"]), "--serial", "no serial device");
}

#[test]
fn help_is_a_distinct_request_whatever_else_is_wrong() {
    let fixture = Fixture::new();
    for args in [&["--help"][..], &["-h"], &["--bogus", "--help"], &["--mem", "x", "-h"]] {
        let error = fixture.args(args).unwrap_err();
        assert!(error.is_help_request(), "{args:?} gave {error}");
    }
    assert!(!fixture.args(&["--bogus"]).unwrap_err().is_help_request());
    for flag in ["--config", "--kernel", "--mem", "--backing", "--cores", "--module", "--serial", "--watchdog", "--control"] {
        assert!(USAGE.contains(flag), "USAGE does not document {flag}");
    }
}

#[test]
fn a_virtio_net_device_names_its_tap_and_reads_back_equal() {
    let fixture = Fixture::new();
    let net = |keys: &str| fixture.load_with_kernel(&format!("[[device]]\nname = \"net0\"\nkind = \"virtio-net\"\n{keys}"));
    let config = net("tap = \"clw-vm0\"\nhost = \"10.7.0.1/24\"\n").unwrap();
    let host = Some(("10.7.0.1".parse().unwrap(), 24));
    assert_eq!(config.devices[0].kind, DeviceKind::VirtioNet { base: 0xd000_0000, irq: 5, tap: "clw-vm0".into(), host });
    let text = config.to_toml_string();
    assert_eq!(fixture.load(&text), Ok(config), "written as:\n{text}");
    assert_error(net(""), "device.net0.tap", "missing");
    assert_error(net("tap = \"t\"\nhost = \"10.7.0.1\"\n"), "device.net0.host", "not an IPv4 address with a prefix length");
    assert_error(net("tap = \"t\"\nhost = \"10.7.0.1/33\"\n"), "device.net0.host", "not an IPv4 address");
    assert_error(net("tap = \"t\"\nbase = 0x1000\n"), "device.net0.base", "overlaps guest RAM");
}
