"""The SIMT ISA: opcode tables, programs, builder, assembler and checker."""
