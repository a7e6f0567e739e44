"""The chart retrieval archive: a readable PDF and a JSON of the chart in an AES-256 ZIP.

Everything goes through files in a temporary directory: the JSON is written encounter by
encounter, pyzipper streams the files into the archive, and the store uploads the archive from
disk, so no step holds the whole archive in memory. The PDF is the exception: fpdf2 keeps every
page in memory until it writes the file, so the PDF shows at most `PDF_MAX_ENCOUNTERS` encounters
(and says how many more the JSON holds); memory stays flat however large the chart.
"""
from __future__ import annotations

import datetime as dt
import json
import os

import pyzipper
from fpdf import FPDF
from fpdf.enums import XPos, YPos

from connectors import Chart

PDF_MAX_ENCOUNTERS = 2000
"""Encounters the PDF shows (~400 pages); the JSON always has all of them. Bounds the PDF's memory."""


def _latin1(text) -> str:
    """PDF core fonts are Latin-1: replace anything else rather than fail on an odd name."""
    return str(text).encode("latin-1", "replace").decode("latin-1")


def write_chart_json(chart: Chart, request_id: str, path: str) -> None:
    p = chart.patient
    head = {"request_id": request_id, "organization": chart.organization_name,
            "patient": {"id": p.id, "first_name": p.first_name, "last_name": p.last_name,
                        "date_of_birth": p.date_of_birth.isoformat(), "sex": p.sex},
            "problems": chart.problems, "medications": chart.medications, "allergies": chart.allergies}
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps(head, indent=1)[:-2] + ',\n "encounters": [')
        for index, e in enumerate(chart.encounters()):
            out.write(("," if index else "") + "\n  " + json.dumps({
                "date": e.date.isoformat(), "type": e.encounter_type, "provider": e.provider, "reason": e.reason,
                "vitals": e.vitals, "assessment": e.assessment, "plan": e.plan}))
        out.write("\n ]\n}\n")


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
        for line in self.wrap(_latin1(text)):
            self.cell(0, 5, line, new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def text_width(self, text: str) -> float:
        widths = self.current_font.cw  # core fonts: 1/1000 of the font size per character
        return sum(widths[c] for c in text) * self.font_size_pt * 0.001 / self.k

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
                    while word_width > width and len(word) > 1:  # a word wider than the page
                        cut = len(word) - 1
                        while cut > 1 and self.text_width(word[:cut]) > width:
                            cut -= 1
                        yield word[:cut]
                        word = word[cut:]
                        word_width = self.text_width(word)
                    line, line_width = word, word_width
                else:
                    line, line_width = f"{line} {word}", line_width + space + word_width
            yield line


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
    for item in chart.problems or [{"code": "", "description": "None recorded", "onset": ""}]:
        pdf.line_text(f"{item['code']}  {item['description']}" + (f"  (since {item['onset']})" if item["onset"] else ""))
    pdf.heading("Medications")
    if not chart.medications:
        pdf.line_text("None recorded")
    for item in chart.medications:
        pdf.line_text(f"{item['name']} {item['dose']}, {item['frequency']} (started {item['started']})")
    pdf.heading("Allergies")
    if not chart.allergies:
        pdf.line_text("No known allergies")
    for item in chart.allergies:
        pdf.line_text(f"{item['substance']}: {item['reaction']} ({item['severity']})")
    pdf.heading("Encounters")
    total = 0
    for e in chart.encounters():
        total += 1
        if total > PDF_MAX_ENCOUNTERS:
            continue  # only counted, for the closing note
        pdf.set_font("Helvetica", "B", 10)
        pdf.line_text(f"{e.date.isoformat()}  {e.encounter_type} with {e.provider}")
        pdf.set_font("Helvetica", "", 10)
        vitals = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in e.vitals.items())
        pdf.line_text(f"Reason: {e.reason}\nVitals: {vitals}\nAssessment: {e.assessment}\nPlan: {e.plan}")
        pdf.ln(2)
    if total > PDF_MAX_ENCOUNTERS:
        pdf.set_font("Helvetica", "I", 10)
        pdf.line_text(f"This PDF shows the first {PDF_MAX_ENCOUNTERS:,} of {total:,} encounters; "
                      f"the JSON file in this archive holds all of them.")
    pdf.output(path)


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
