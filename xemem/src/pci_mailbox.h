/*
 * The XEMEM PCI device's ids and mailbox layout (docs/xemem-pci.md, "The mailbox"), for
 * libxpmem's guest backend (backend_pci.c) and its fake device test (tests/pci_fake.c). The
 * values are those of xemem/protocol/src/pci.rs, the one definition (the VMM's device and the
 * guest agent use it); its test `the_c_header_spells_the_same_values` (cargo test -p xemem)
 * fails when a literal here differs from it or one is missing on either side. Plain literals
 * only, so that test can read them; the struct below is checked against them at compile time.
 */
#ifndef XEMEM_PCI_MAILBOX_H
#define XEMEM_PCI_MAILBOX_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#define PCI_VENDOR 0xc10d
#define PCI_DEVICE 0x0001
#define PCI_MAILBOX_SIZE 0x10000UL
#define PCI_MAGIC 0x504d4558u /* "XEMP" */
#define PCI_VERSION 1

/* Byte offsets of the mailbox's fields. */
#define PCI_MAGIC_AT 0x00
#define PCI_VERSION_AT 0x04
#define PCI_DOORBELL 0x08
#define PCI_DONE 0x0c
#define PCI_OP 0x10
#define PCI_ERROR 0x14
#define PCI_NRUNS 0x18
#define PCI_ARGS 0x20
#define PCI_RESULTS 0x50
#define PCI_NAME 0x80
#define PCI_NAME_LEN 64
#define PCI_RUNS 0x100
#define PCI_RUN_SIZE 16

/* The ops, written at PCI_OP. */
#define PCI_OP_HELLO 1
#define PCI_OP_RUNS 2
#define PCI_OP_MAKE 3
#define PCI_OP_REMOVE 4
#define PCI_OP_GET 5
#define PCI_OP_RELEASE 6
#define PCI_OP_ATTACH 7
#define PCI_OP_DETACH 8
#define PCI_OP_LOOKUP 9
#define PCI_OP_SIGNAL 10

/* Messages to the guest agent's keeper (xemem/protocol/src/pci.rs says what each carries):
 * PCI_KEEPER_MESSAGE bytes, u32 op, u32 zero, u64 a, u64 b. */
#define PCI_KEEPER_KEEP 1
#define PCI_KEEPER_MADE 2
#define PCI_KEEPER_DROP 3
#define PCI_KEEPER_NOTIFY 6
#define PCI_KEEPER_MESSAGE 24

/* The attachment board (xemem/protocol/src/pci.rs says how it is used): slots of u32 pid,
 * u32 generation, u64 start time, u64 window offset, u64 length. */
#define PCI_BOARD_SLOTS 4096
#define PCI_BOARD_SLOT_SIZE 32
#define PCI_BOARD_PID_AT 0
#define PCI_BOARD_GENERATION_AT 4
#define PCI_BOARD_START_AT 8
#define PCI_BOARD_OFFSET_AT 16
#define PCI_BOARD_LEN_AT 24

/* A run of guest-physical memory: the unit an export is described in. */
struct pci_run {
	uint64_t gpa, len;
};

/* The mailbox BAR. */
struct pci_mailbox {
	uint32_t magic, version; /* set by the host */
	uint32_t doorbell;       /* the guest writes a request's sequence number here */
	uint32_t done;           /* the host writes it back once the answer is in place */
	uint32_t op;
	int32_t error; /* an errno value, 0 on success */
	uint32_t nruns, reserved0;
	uint64_t args[6];
	uint64_t results[4];
	uint8_t reserved1[16];
	char name[PCI_NAME_LEN];
	uint8_t reserved2[64];
	struct pci_run runs[];
};
_Static_assert(offsetof(struct pci_mailbox, magic) == PCI_MAGIC_AT && offsetof(struct pci_mailbox, version) == PCI_VERSION_AT &&
		       offsetof(struct pci_mailbox, doorbell) == PCI_DOORBELL && offsetof(struct pci_mailbox, done) == PCI_DONE &&
		       offsetof(struct pci_mailbox, op) == PCI_OP && offsetof(struct pci_mailbox, error) == PCI_ERROR &&
		       offsetof(struct pci_mailbox, nruns) == PCI_NRUNS && offsetof(struct pci_mailbox, args) == PCI_ARGS &&
		       offsetof(struct pci_mailbox, results) == PCI_RESULTS && offsetof(struct pci_mailbox, name) == PCI_NAME &&
		       offsetof(struct pci_mailbox, runs) == PCI_RUNS && sizeof(struct pci_run) == PCI_RUN_SIZE,
	       "the mailbox struct matches the offsets");
/* One slot of the attachment board. */
struct pci_board_slot {
	_Atomic uint32_t pid, generation;
	uint64_t start, window_offset, len;
};
_Static_assert(offsetof(struct pci_board_slot, pid) == PCI_BOARD_PID_AT &&
		       offsetof(struct pci_board_slot, generation) == PCI_BOARD_GENERATION_AT &&
		       offsetof(struct pci_board_slot, start) == PCI_BOARD_START_AT &&
		       offsetof(struct pci_board_slot, window_offset) == PCI_BOARD_OFFSET_AT &&
		       offsetof(struct pci_board_slot, len) == PCI_BOARD_LEN_AT &&
		       sizeof(struct pci_board_slot) == PCI_BOARD_SLOT_SIZE,
	       "the board slot matches the offsets");
#define PCI_MAX_RUNS ((PCI_MAILBOX_SIZE - PCI_RUNS) / PCI_RUN_SIZE)

#endif
