"""The verification report as JUnit XML (one test case per check); its JSON record is
`VerifyReport.to_record`."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from provision.verify import VerifyReport


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
        if result.status == "fail":
            ET.SubElement(case, "failure", message=result.summary).text = "\n".join(result.evidence)
        elif result.status == "skip":
            ET.SubElement(case, "skipped", message=result.summary)
        ET.SubElement(case, "system-out").text = "\n".join(
            (result.summary, *result.evidence, *result.warnings)
        )
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
