"""The chart archive's PDF: wrapped text, and a bounded number of encounters (the JSON has all)."""
from __future__ import annotations

import datetime as dt
import io
import json

import pypdf
import pyzipper

from connectors import Chart, Encounter, Patient
from workers import chart_archive


def chart_with(count: int, note: str = "Condition stable on current regimen.") -> Chart:
    def encounters():
        for i in range(count):
            yield Encounter(date=dt.date(2020, 1, 1) + dt.timedelta(days=i), encounter_type="Follow-up",
                            provider="Dr. Test", reason=f"Visit number {i}", vitals={"pulse": 70 + i % 9},
                            assessment=note, plan="Follow up in 3 months.")
    return Chart(patient=Patient(id="pat_1", first_name="Ada", last_name="Lovelace",
                                 date_of_birth=dt.date(1970, 5, 17), sex="female"),
                 organization_name="Test Clinic", encounter_source=encounters)


def read_zip(path: str) -> tuple[str, dict]:
    with pyzipper.AESZipFile(path) as archive:
        archive.setpassword(b"pw")
        pdf = pypdf.PdfReader(io.BytesIO(archive.read("req_1.pdf")))
        text = "\n".join(page.extract_text() for page in pdf.pages)
        return text, json.loads(archive.read("req_1.json"))


def test_long_lines_wrap_within_the_page_and_keep_every_word(tmp_path):
    note = " ".join(f"word{i}" for i in range(120)) + " " + "x" * 300
    text, data = read_zip(chart_archive.write_chart_zip(chart_with(2, note), "req_1", "pw", str(tmp_path)))
    assert all(f"word{i}" in text for i in range(120))
    assert "x" * 300 in text.replace("\n", "")  # a word wider than the page is split, not lost
    pdf = chart_archive.ChartPdf("t")
    pdf.add_page()
    pdf.set_font("Helvetica", "", 10)
    lines = list(pdf.wrap(note))
    assert len(lines) > 5 and all(pdf.get_string_width(line) <= pdf.epw for line in lines)


def test_pdf_shows_at_most_the_bound_and_says_where_the_rest_is(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_archive, "PDF_MAX_ENCOUNTERS", 5)
    text, data = read_zip(chart_archive.write_chart_zip(chart_with(12), "req_1", "pw", str(tmp_path)))
    assert len(data["encounters"]) == 12
    assert "Visit number 4" in text and "Visit number 5" not in text
    assert "first 5 of 12 encounters" in text.replace("\n", " ")
    text, data = read_zip(chart_archive.write_chart_zip(chart_with(5), "req_1", "pw", str(tmp_path)))
    assert len(data["encounters"]) == 5 and "Visit number 4" in text and "first 5" not in text
