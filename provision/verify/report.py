"""The verification report as JUnit XML (one test case per check); its JSON record is
`VerifyReport.to_record`.

Summaries and evidence quote Consul; XML 1.0 cannot even hold most control characters, so every
such string goes through `printable` (escaped, bounded) on its way in.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from provision.system.text import printable
from provision.verify import VerifyReport

LINE_LIMIT = 1000  # characters of one summary, evidence line or warning


def junit_xml(report: VerifyReport) -> str:
    failures = sum(1 for r in report.results if r.status == "fail")
    skipped = sum(1 for r in report.results if r.status == "skip")
    suite = ET.Element(
        "testsuite",
        name="lockctl verify",
        tests=str(len(report.results)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{report.seconds:.3f}",
    )
    for result in report.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname="lockctl.verify",
            name=result.name,
            time=f"{result.seconds:.3f}",
        )
        summary, evidence = _safe(result.summary), [_safe(line) for line in result.evidence]
        if result.status == "fail":
            ET.SubElement(case, "failure", message=summary).text = "\n".join(evidence)
        elif result.status == "skip":
            ET.SubElement(case, "skipped", message=summary)
        warnings = [_safe(warning) for warning in result.warnings]
        ET.SubElement(case, "system-out").text = "\n".join((summary, *evidence, *warnings))
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _safe(text: str) -> str:
    return printable(text, LINE_LIMIT)
