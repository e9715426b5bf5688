// SPDX-License-Identifier: MIT
// NVMe definitions: register layouts, entry encoders, status names, bam::error.
#include <bam/error.hpp>
#include <bam/nvme/identify.hpp>
#include <bam/nvme/spec.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>

using namespace bam::nvme;

TEST_CASE("register bit-fields decode the spec's layout", "[spec]") {
  cap_register cap{};
  // MQES=1023, CQR=1, TO=20 (10 s), DSTRD=2, CSS bit 0, MPSMIN=0, MPSMAX=4
  cap.raw = 1023ull | (1ull << 16) | (20ull << 24) | (2ull << 32) | (1ull << 37) | (4ull << 52);
  CHECK(cap.bits.mqes == 1023);
  CHECK(cap.bits.cqr == 1);
  CHECK(cap.bits.to == 20);
  CHECK(cap.bits.dstrd == 2);
  CHECK(cap.bits.css == 1);
  CHECK(cap.bits.mpsmin == 0);
  CHECK(cap.bits.mpsmax == 4);

  cc_register cc{};
  cc.bits.en = 1;
  cc.bits.iosqes = sq_entry_log2;
  cc.bits.iocqes = cq_entry_log2;
  cc.bits.shn = static_cast<std::uint32_t>(shutdown_notification::normal);
  CHECK(cc.raw == (1u | (6u << 16) | (4u << 20) | (1u << 14)));

  csts_register csts{};
  csts.raw = 0x9; // RDY and SHST=complete(2)
  CHECK(csts.bits.rdy == 1);
  CHECK(csts.bits.shst == static_cast<std::uint32_t>(shutdown_status::complete));

  aqa_register aqa{};
  aqa.bits.asqs = 31;
  aqa.bits.acqs = 63;
  CHECK(aqa.raw == (31u | (63u << 16)));
}

TEST_CASE("doorbell offsets follow CAP.DSTRD", "[spec]") {
  for (std::uint32_t dstrd = 0; dstrd < 4; ++dstrd) {
    const std::uint32_t stride = 4u << dstrd;
    for (std::uint32_t q = 0; q < 8; ++q) {
      CHECK(sq_doorbell_offset(q, dstrd) == 0x1000 + 2 * q * stride);
      CHECK(cq_doorbell_offset(q, dstrd) == 0x1000 + (2 * q + 1) * stride);
    }
  }
}

TEST_CASE("command encoders place fields where the spec says", "[spec]") {
  const command r = make_read(7, 0x1'2345'6789ull, 16, 0x1000, 0x2000);
  unsigned char raw[64];
  std::memcpy(raw, &r, 64);
  CHECK(raw[0] == 0x02);
  std::uint32_t dw[16];
  std::memcpy(dw, &r, 64);
  CHECK(dw[1] == 7);              // NSID
  CHECK(dw[10] == 0x2345'6789u);  // SLBA low
  CHECK(dw[11] == 0x1u);          // SLBA high
  CHECK((dw[12] & 0xffff) == 15); // NLB, 0-based
  CHECK(command_nblocks(r) == 16);
  CHECK(command_slba(r) == 0x1'2345'6789ull);
  CHECK(r.prp1 == 0x1000);
  CHECK(r.prp2 == 0x2000);

  const command cq = make_create_io_cq(3, 1024, 0xabc000);
  CHECK(cq.opcode == 0x05);
  CHECK(cq.cdw10 == (3u | (1023u << 16)));
  CHECK(cq.cdw11 == 1u); // physically contiguous, no interrupts
  const command sq = make_create_io_sq(3, 1024, 0xdef000, 3);
  CHECK(sq.opcode == 0x01);
  CHECK(sq.cdw11 >> 16 == 3u);

  const command nq = make_set_num_queues(128, 64);
  CHECK(nq.opcode == 0x09);
  CHECK((nq.cdw10 & 0xff) == 0x07);
  CHECK(nq.cdw11 == (127u | (63u << 16)));

  const command lp = make_get_log_page(log_page_id::smart_health, 0xffffffffu, 512, 0x3000);
  CHECK((lp.cdw10 & 0xff) == 0x02);
  CHECK((lp.cdw10 >> 16) == 127u); // 128 dwords, 0-based
  const command ab = make_abort(5, 77);
  CHECK(ab.cdw10 == (5u | (77u << 16)));
  const command wz = make_write_zeroes(1, 99, 65536);
  CHECK(wz.opcode == 0x08);
  CHECK((wz.cdw12 & 0xffff) == 0xffff);
}

TEST_CASE("completion status decodes SCT, SC, DNR and phase", "[spec]") {
  completion c{};
  // phase 1, SC=0x80 (LBA out of range), SCT=0, DNR=1
  c.status_phase = static_cast<std::uint16_t>(1 | (0x80 << 1) | (1 << 15));
  CHECK(c.phase());
  CHECK(c.status().sc() == generic_status::lba_out_of_range);
  CHECK(c.status().sct() == status_type::generic);
  CHECK(c.status().dnr());
  CHECK_FALSE(c.status().ok());
  CHECK(std::string(status_name(c.status())) == "LBA Out of Range");

  CHECK(status_success.ok());
  CHECK(std::string(status_name(status{status_type::generic, generic_status::invalid_opcode})) ==
        "Invalid Command Opcode");
  CHECK(std::string(
            status_name(status{status_type::command_specific, command_specific_status::invalid_queue_identifier})) ==
        "Invalid Queue Identifier");
  CHECK(std::string(status_name(status_timeout)) == "Timeout (no completion)");
  CHECK(status_timeout.is_bam(bam_status::timeout));
  CHECK(status_timeout != status_queue_broken);
}

TEST_CASE("bam::error prints one line with every field", "[spec][error]") {
  bam::error_context c;
  c.controller = "emu:ram=1M";
  c.queue = 3;
  c.opcode = 0x02;
  c.cid = 17;
  c.lba = 123456;
  c.status = status{status_type::generic, generic_status::lba_out_of_range};
  c.errnum = 5;
  const bam::error e("read failed", c);
  const std::string s = e.what();
  CHECK(s.find('\n') == std::string::npos);
  CHECK_THAT(s, Catch::Matchers::StartsWith("bam: read failed: controller emu:ram=1M"));
  CHECK_THAT(s, Catch::Matchers::ContainsSubstring("queue 3"));
  CHECK_THAT(s, Catch::Matchers::ContainsSubstring("opcode 0x02"));
  CHECK_THAT(s, Catch::Matchers::ContainsSubstring("cid 17"));
  CHECK_THAT(s, Catch::Matchers::ContainsSubstring("LBA 123456"));
  CHECK_THAT(s, Catch::Matchers::ContainsSubstring("LBA Out of Range (sct 0x0 sc 0x80)"));
  CHECK_THAT(s, Catch::Matchers::ContainsSubstring("errno 5"));
  REQUIRE(e.status().has_value());
  CHECK(e.status()->sc() == generic_status::lba_out_of_range);
}

TEST_CASE("libnvme identify structures have the spec's size", "[spec]") {
  nvme_id_ctrl ctrl{};
  ctrl.mdts = 5;
  unsigned char raw[4096];
  std::memcpy(raw, &ctrl, sizeof raw);
  CHECK(raw[77] == 5);
  nvme_id_ns ns{};
  ns.lbaf[0].ds = 12;
  std::memcpy(raw, &ns, sizeof raw);
  CHECK(raw[128 + 2] == 12); // LBAF0: MS (2 bytes), LBADS, RP
}
