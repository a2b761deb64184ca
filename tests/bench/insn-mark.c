// SPDX-License-Identifier: GPL-2.0
/*
 * insn-mark: executes the marker instruction that tests/bench/insncount.c
 * (a QEMU plugin) answers with a snapshot of its instruction counts. A
 * no-op anywhere else.
 */
int main(void)
{
	__asm__ volatile(".byte 0x0f, 0x1f, 0x80, 0x52, 0x57, 0x49, 0x53"); /* nopl 0x53495752(%rax) */
	return 0;
}
