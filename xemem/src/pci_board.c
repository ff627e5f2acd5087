/*
 * The attachment board of a Linux VM's XEMEM backend (xemem/protocol/src/pci.rs, "board";
 * docs/xemem-pci.md): a shared file in the guest where each attachment is noted, with its
 * process's pid and start time, by plain stores. The guest agent reads it only when the daemon
 * reports a user-mode touch of a revoked placement, and sends SIGBUS to the processes noted on
 * that placement. It replaced a message to the agent's keeper per attach and per detach: each
 * woke the agent, which on a PVM host cost 2-50 ms of emulated guest kernel an attach (an
 * attach itself is a mailbox exit of about 0.4 ms).
 *
 * A slot is taken by compare-and-swap of its pid word (0: free), and its generation is odd
 * while its other words are written, so the agent never reads half an entry. The start time
 * (field 22 of /proc/self/stat, read once per process) makes a slot left behind by a process
 * that ended without detaching harmless: the agent signals only a process with the same pid and
 * start time, and frees slots whose process is gone; this library frees them too when it finds
 * the board full. Without the board (no writable /run), attaches work and a touch after a
 * revocation reads all ones instead of raising SIGBUS: said once on stderr.
 */
#include "xpmem_internal.h"
#include "pci_mailbox.h"

static struct pci_board_slot *board; /* NULL: none (not opened yet, or unusable) */
static int board_tried;
static pid_t board_pid;     /* whose start time `board_start` is (a forked child reads its own) */
static uint64_t board_start;
static size_t board_hint;   /* where the next search for a free slot begins */

/* A process's start time, field 22 of /proc/PID/stat ("self" for this one): 0 if unreadable. */
static uint64_t start_time(const char *pid)
{
	char path[64], text[1024];
	snprintf(path, sizeof path, "/proc/%s/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t got = read(fd, text, sizeof text - 1);
	close(fd);
	if (got <= 0)
		return 0;
	text[got] = 0;
	/* The command name (field 2) may hold spaces and parentheses: fields count from its last ')'. */
	char *at = strrchr(text, ')');
	for (int field = 2; at && field < 22; field++)
		at = strchr(at + 1, ' ');
	return at ? strtoull(at + 1, NULL, 10) : 0;
}

/* Maps the board ($CLOWDER_XEMEM_PCI_BOARD, default /run/xemem-pci.attachments) on first use. */
static struct pci_board_slot *open_board(void)
{
	if (board_tried)
		return board;
	board_tried = 1;
	const char *path;
	board = pci_map_run_file("CLOWDER_XEMEM_PCI_BOARD", "/run/xemem-pci.attachments", PCI_BOARD_SLOTS * PCI_BOARD_SLOT_SIZE,
				 &path);
	if (!board)
		fprintf(stderr, "libxpmem: %s: %s: a touch of a revoked attachment reads all ones instead of raising SIGBUS\n",
			path, strerror(errno));
	return board;
}

/* Frees slot `slot` if it still holds what was read of it (pid, even generation `generation`). */
static void free_slot(struct pci_board_slot *slot, uint32_t pid, uint32_t generation)
{
	uint32_t expected = generation;
	if (!atomic_compare_exchange_strong(&slot->generation, &expected, generation + 1))
		return;
	slot->window_offset = slot->len = slot->start = 0;
	atomic_store(&slot->generation, generation + 2);
	atomic_compare_exchange_strong(&slot->pid, &pid, 0);
}

/* Frees the slots of processes that ended without detaching: how many. */
static size_t sweep(struct pci_board_slot *slots)
{
	size_t freed = 0;
	for (size_t i = 0; i < PCI_BOARD_SLOTS; i++) {
		uint32_t generation = atomic_load(&slots[i].generation), pid = atomic_load(&slots[i].pid);
		if (!pid || generation % 2)
			continue;
		char name[16];
		snprintf(name, sizeof name, "%u", pid);
		uint64_t noted = slots[i].start;
		if (start_time(name) != noted) {
			free_slot(&slots[i], pid, generation);
			freed++;
		}
	}
	return freed;
}

/* Notes this process's attachment of the placement at `window_offset`: its slot, or -1 (no
 * board, or full of live processes' attachments). */
int pci_board_note(uint64_t window_offset, uint64_t len)
{
	struct pci_board_slot *slots = open_board();
	if (!slots)
		return -1;
	pid_t me = getpid();
	if (board_pid != me) {
		board_start = start_time("self");
		board_pid = me;
	}
	for (int pass = 0; pass < 2; pass++) {
		for (size_t n = 0; n < PCI_BOARD_SLOTS; n++) {
			size_t i = (board_hint + n) % PCI_BOARD_SLOTS;
			uint32_t free = 0;
			if (!atomic_compare_exchange_strong(&slots[i].pid, &free, (uint32_t)me))
				continue;
			atomic_fetch_add(&slots[i].generation, 1);
			slots[i].start = board_start;
			slots[i].window_offset = window_offset;
			slots[i].len = len;
			atomic_fetch_add(&slots[i].generation, 1);
			board_hint = i + 1;
			return (int)i;
		}
		if (pass == 0 && sweep(slots) == 0)
			break;
	}
	static int said;
	if (!said++)
		fprintf(stderr, "libxpmem: the attachment board is full: a touch of a revoked attachment reads all ones instead of raising SIGBUS\n");
	return -1;
}

/* Takes the note of slot `slot` off the board (not if another process holds it: a child that
 * inherited the attachment across fork detaching it). */
void pci_board_clear(int slot)
{
	if (!board || slot < 0 || slot >= (int)PCI_BOARD_SLOTS)
		return;
	struct pci_board_slot *entry = &board[slot];
	uint32_t generation = atomic_load(&entry->generation);
	if (atomic_load(&entry->pid) == (uint32_t)getpid() && generation % 2 == 0)
		free_slot(entry, (uint32_t)getpid(), generation);
}
