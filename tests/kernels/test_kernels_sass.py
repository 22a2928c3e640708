"""Main-loop instruction counts from SASS / PTX text (``primectl_kernels.sass``, pure Python)."""

from __future__ import annotations

from primectl_kernels.sass import ptx_loop_stats, sass_loop_stats

SASS = """
_k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @P0 BRA `(.L_x_2) ;
.L_x_0:
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/                   HMMA.16816.F32 R8, R4, R6, R8 ;
        /*0040*/              @!P1 BRA `(.L_x_1) ;
        /*0050*/                   CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64) ;
.L_x_1:
        /*0060*/                   LDSM.16.M88.4 R12, [R20+UR4] ;
        /*0070*/                   BRA.U !UP1, `(.L_x_0) ;
.L_x_2:
        /*0080*/                   EXIT ;
.L_x_3:
        /*0090*/                   BRA `(.L_x_3);
$__internal_0_$__cuda_sm20_div_s64:
        /*00a0*/                   IADD3 R116, P6, RZ, -UR9, RZ ;
        /*00b0*/                   IMAD.X R118, RZ, RZ, ~R195, P6 ;
        /*00c0*/                   RET.REL.NODEC R116 `(_k) ;
"""


def test_sass_loop_is_the_widest_backward_branch() -> None:
    stats = sass_loop_stats(SASS)
    assert stats.source == "sass"
    assert stats.total_instructions == 13
    # LDG, HMMA, BRA, CALL, LDSM, BRA.U: the forward branch and the trap's self-loop are not loops
    assert stats.instructions == 6
    assert stats.calls == 1 and stats.call_instructions == 3 and stats.effective == 9
    assert stats.classes["mma"] == 1 and stats.classes["smem"] == 1 and stats.classes["gmem"] == 1
    assert stats.opcodes["BRA"] == 2


def test_sass_without_a_loop() -> None:
    stats = sass_loop_stats(SASS.replace("BRA.U !UP1, `(.L_x_0)", "NOP"))
    assert stats.instructions == 0 and stats.total_instructions == 13


PTX = """
.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .b32 	%r<4>;
	mov.u32 	%r1, 0;
$L__BB0_1:                              // =>This Inner Loop Header
	ld.global.b32 	%r2, [%rd1];
	mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f1, %f2, %f3, %f4};
	add.s32 	%r1, %r1, 1;
	@%p1 bra 	$L__BB0_1;
	ret;
}
"""


def test_ptx_fallback_counts_between_loop_labels() -> None:
    stats = ptx_loop_stats(PTX)
    assert stats.source == "ptx"
    assert stats.instructions == 4
    assert stats.classes["mma"] == 1
    assert stats.total_instructions == 6
