"""The chart retrieval archive: a readable PDF and a JSON of the chart in an AES-256 ZIP.

Everything goes through files in a temporary directory: the JSON is written entry by entry
(encounters, observations, documents stream from the chart), pyzipper streams the files into the
archive, and the store uploads the archive from disk, so no step holds the whole archive in
memory. The PDF is the exception: fpdf2 keeps every page in memory until it writes the file, so
the PDF shows at most `PDF_MAX_ENCOUNTERS` encounters, `PDF_MAX_OBSERVATIONS` observations,
`PDF_MAX_DOCUMENTS` documents and `PDF_MAX_LIST` problems, medications and allergies each (and says how many more the JSON holds), and at most `PDF_MAX_TEXT`
characters of any one text (an EHR's field can be megabytes); memory and time stay flat however
large the chart.
"""
from __future__ import annotations

import datetime as dt
import itertools
import json
import os

import pyzipper
from fpdf import FPDF
from fpdf.enums import XPos, YPos

from connectors import Chart
from workers.chart_schema import entry

PDF_MAX_ENCOUNTERS = 2000
"""Encounters the PDF shows (~400 pages); the JSON always has all of them. Bounds the PDF's memory."""
PDF_MAX_OBSERVATIONS = 5000
"""Observations the PDF shows (one line each, ~100 pages); the JSON has all of them."""
PDF_MAX_DOCUMENTS = 2000
"""Documents the PDF lists (one line each); the JSON has all of them."""
PDF_MAX_LIST = 2000
"""Problems, medications and allergies the PDF lists, each (one line each); the JSON has all of them."""
PDF_MAX_TEXT = 4000
"""Characters of one text the PDF shows (an EHR's name, reason or value: ~1 page); the JSON has all of it."""


def _latin1(text) -> str:
    """PDF core fonts are Latin-1: replace anything else rather than fail on an odd name."""
    return str(text).encode("latin-1", "replace").decode("latin-1")


def write_chart_json(chart: Chart, request_id: str, path: str) -> None:
    """The chart as JSON in the one shape of `workers.chart_schema` (GET /v1/schemas/chart.json)."""
    p = chart.patient
    head = {"request_id": request_id, "organization": chart.organization_name,
            "patient": {"id": p.id, "first_name": p.first_name, "last_name": p.last_name,
                        "date_of_birth": p.date_of_birth.isoformat(), "sex": p.sex}}
    omitted = [{"resourceType": o["resourceType"], "reason": o["reason"]} for o in chart.omitted]
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps(head, indent=1)[:-2])
        for name in ("problems", "medications", "allergies"):
            _json_array(out, name, (entry(name, e) for e in getattr(chart, name)))
        out.write(',\n "omitted": ' + json.dumps(omitted))
        _json_array(out, "encounters", (encounter_entry(e) for e in chart.encounters()))
        _json_array(out, "observations", (entry("observations", o) for o in chart.observations()))
        _json_array(out, "documents", (entry("documents", d) for d in chart.documents()))
        out.write("\n}\n")


def encounter_entry(e) -> dict:
    """An encounter in the JSON (its vital signs are observations, not fields of the encounter)."""
    return entry("encounters", {"id": e.id, "date": e.date.isoformat(), "type": e.encounter_type,
                                "provider": e.provider, "reason": e.reason, "assessment": e.assessment, "plan": e.plan})


def _json_array(out, name: str, entries) -> None:
    """`,\n "name": [...]`, one entry per line as it comes."""
    out.write(f',\n "{name}": [')
    for index, item in enumerate(entries):
        out.write(("," if index else "") + "\n  " + json.dumps(item))
    out.write("\n ]")


class ChartPdf(FPDF):
    def __init__(self, title: str):
        super().__init__(format="Letter")
        self.title_text = title
        self.set_auto_page_break(auto=True, margin=18)
        self.set_title(title)
        self.set_author("svc-auth chart retrieval")

    def footer(self):
        self.set_y(-12)
        self.set_font("Helvetica", "I", 8)
        self.cell(0, 8, _latin1(f"{self.title_text} - page {self.page_no()}"), align="C")

    def heading(self, text: str) -> None:
        self.ln(3)
        self.set_font("Helvetica", "B", 12)
        self.cell(0, 7, _latin1(text), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        self.set_font("Helvetica", "", 10)

    def line_text(self, text: str) -> None:
        """`text` wrapped at word boundaries to the page width, one `cell` per line.

        fpdf2's `multi_cell` re-measures the whole line for every character it adds (quadratic
        in the line length), and even `get_string_width` copies the graphics state per call:
        ~4 ms per encounter. Summing the core font's character widths word by word is linear.
        """
        for line in self.wrap(_latin1(_clipped(str(text)))):
            self.cell(0, 5, line, new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def text_width(self, text: str) -> float:
        return sum(self.char_widths(text))

    def char_widths(self, text: str):
        """The width of each character (core fonts: 1/1000 of the font size per character)."""
        widths, scale = self.current_font.cw, self.font_size_pt * 0.001 / self.k
        return (widths[c] * scale for c in text)

    def pieces(self, word: str, width: float):
        """`word` cut into pieces no wider than `width` (one character at least), in one pass: a
        word as long as the EHR likes costs time linear in its length."""
        start, used = 0, 0.0
        for index, char_width in enumerate(self.char_widths(word)):
            if used + char_width > width and index > start:
                yield word[start:index]
                start, used = index, 0.0
            used += char_width
        yield word[start:]

    def wrap(self, text: str):
        """Lines of `text` no wider than the cell width, broken at spaces (or inside a longer word)."""
        width = self.epw - 2 * self.c_margin
        space = self.text_width(" ")
        for paragraph in text.split("\n"):
            line, line_width = "", 0.0
            for word in paragraph.split(" "):
                word_width = self.text_width(word)
                if not line or line_width + space + word_width > width:
                    if line:
                        yield line
                    if word_width > width:  # a word wider than the page: all but its last piece
                        *full, word = self.pieces(word, width)
                        yield from full
                        word_width = self.text_width(word)
                    line, line_width = word, word_width
                else:
                    line, line_width = f"{line} {word}", line_width + space + word_width
            yield line


def _clipped(text: str) -> str:
    """`text` cut to `PDF_MAX_TEXT` characters, saying so (the JSON holds the whole of it)."""
    if len(text) <= PDF_MAX_TEXT:
        return text
    return (f"{text[:PDF_MAX_TEXT]} [... {len(text) - PDF_MAX_TEXT:,} more characters: "
            f"the JSON file in this archive holds the whole text]")


def write_chart_pdf(chart: Chart, request_id: str, path: str, created: dt.datetime | None = None) -> None:
    p = chart.patient
    pdf = ChartPdf(f"Patient chart {request_id}")
    if created is not None:
        pdf.set_creation_date(created.replace(tzinfo=dt.timezone.utc))
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 16)
    pdf.cell(0, 10, "Patient chart", new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.set_font("Helvetica", "", 10)
    pdf.line_text(f"Request: {request_id}")
    pdf.line_text(f"Organization: {chart.organization_name}")
    pdf.heading("Patient")
    pdf.line_text(f"Name: {p.first_name} {p.last_name}")
    pdf.line_text(f"Patient ID: {p.id}")
    pdf.line_text(f"Date of birth: {p.date_of_birth.isoformat()}    Sex: {p.sex}")
    pdf.heading("Problems")
    _bounded(pdf, chart.problems, PDF_MAX_LIST, "problems", lambda pdf, item: pdf.line_text(
        f"{item['code']}  {item['description']}" + (f"  (since {item['onset']})" if item["onset"] else "")))
    pdf.heading("Medications")
    _bounded(pdf, chart.medications, PDF_MAX_LIST, "medications", lambda pdf, item: pdf.line_text(
        f"{item['name']} {item['dose']}, {item['frequency']} (started {item['started']})"))
    pdf.heading("Allergies")
    if not chart.allergies:
        pdf.line_text("No known allergies")
    else:
        _bounded(pdf, chart.allergies, PDF_MAX_LIST, "allergies", lambda pdf, item: pdf.line_text(
            f"{item['substance']}: {item['reaction']} ({item['severity']})"))
    pdf.heading("Encounters")
    _bounded(pdf, chart.encounters(), PDF_MAX_ENCOUNTERS, "encounters", _encounter_lines)
    observations, documents = iter(chart.observations()), iter(chart.documents())
    for first in itertools.islice(observations, 1):  # a section only when the chart has such entries
        pdf.heading("Observations")
        _bounded(pdf, itertools.chain((first,), observations), PDF_MAX_OBSERVATIONS, "observations", _observation_line)
    for first in itertools.islice(documents, 1):
        pdf.heading("Documents")
        _bounded(pdf, itertools.chain((first,), documents), PDF_MAX_DOCUMENTS, "documents", _document_line)
    if chart.omitted:  # what the EHR would not give: the chart says so rather than look complete
        pdf.heading("Not available from the EHR")
        for item in chart.omitted:
            pdf.line_text(_latin1(f"{item['resourceType']}: {item['reason']}"))
    pdf.output(path)


def _bounded(pdf: ChartPdf, entries, limit: int, noun: str, draw) -> None:
    """Draw the first `limit` entries; count the rest and say the JSON holds them."""
    total = 0
    for item in entries:
        total += 1
        if total <= limit:
            draw(pdf, item)
    if total == 0:
        pdf.line_text("None recorded")
    elif total > limit:
        pdf.set_font("Helvetica", "I", 10)
        pdf.line_text(f"This PDF shows the first {limit:,} of {total:,} {noun}; "
                      f"the JSON file in this archive holds all of them.")
        pdf.set_font("Helvetica", "", 10)


def _encounter_lines(pdf: ChartPdf, e) -> None:
    pdf.set_font("Helvetica", "B", 10)
    pdf.line_text(f"{e.date.isoformat()}  {e.encounter_type}" + (f" with {e.provider}" if e.provider else ""))
    pdf.set_font("Helvetica", "", 10)
    lines = [("Reason", e.reason), ("Assessment", e.assessment), ("Plan", e.plan)]  # vitals: under Observations
    pdf.line_text("\n".join(f"{label}: {value}" for label, value in lines if value))
    pdf.ln(2)


def _observation_line(pdf: ChartPdf, o: dict) -> None:
    value = f"{o['value']} {o['unit']}".strip()
    flag = f" [{o['interpretation']}]" if o.get("interpretation") else ""
    pdf.line_text(f"{o['date'] or 'undated'}  {o['name']}: {value}{flag}" + (f"  ({o['category']})" if o["category"] else ""))


def _document_line(pdf: ChartPdf, d: dict) -> None:
    kind = ", ".join(part for part in (d["type"], d["content_type"]) if part and part != d["title"])
    pdf.line_text(f"{d['date'] or 'undated'}  {d['title'] or 'Untitled document'}" + (f"  ({kind})" if kind else ""))


def zip_password(application_id: str) -> str:
    """The spec's rule: a chart ZIP's password is the identifier of the application that asked for it
    (the test-mode archive's is SVC_DEMO_APPLICATION_ID, the test-mode application's identifier)."""
    return application_id


def write_chart_zip(chart: Chart, request_id: str, password: str, directory: str,
                    created: dt.datetime | None = None) -> str:
    """Write `<request_id>.zip` (AES-256, `password`) with `<request_id>.pdf` and `.json`; returns its path."""
    pdf_path = os.path.join(directory, f"{request_id}.pdf")
    json_path = os.path.join(directory, f"{request_id}.json")
    zip_path = os.path.join(directory, f"{request_id}.zip")
    write_chart_pdf(chart, request_id, pdf_path, created)
    write_chart_json(chart, request_id, json_path)
    with pyzipper.AESZipFile(zip_path, "w", compression=pyzipper.ZIP_DEFLATED, encryption=pyzipper.WZ_AES) as archive:
        archive.setpassword(password.encode("utf-8"))
        archive.setencryption(pyzipper.WZ_AES, nbits=256)
        archive.write(pdf_path, f"{request_id}.pdf")
        archive.write(json_path, f"{request_id}.json")
    os.unlink(pdf_path)
    os.unlink(json_path)
    return zip_path
